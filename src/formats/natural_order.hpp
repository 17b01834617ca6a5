// "Natural" order for tag and file names: digit runs compare as numbers (global_step9 < global_step10).
#pragma once

#include <string_view>

namespace ckptfs {

bool natural_less(std::string_view a, std::string_view b);

// Whether `a` and `b` are names of one series, the same but for their numbers (global_step9 and
// global_step10; not global_step9 and global_step9_universal, nor best).
bool same_series(std::string_view a, std::string_view b);

// Whether a tracker naming `tracked` has reached `name`: a name of another series it says nothing about,
// one of its series it has reached unless the name comes after it (a save being written).
bool tracker_reached(std::string_view tracked, std::string_view name);

}  // namespace ckptfs
