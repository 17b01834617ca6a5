// "Natural" order for tag and file names: digit runs compare as numbers (global_step9 < global_step10).
#pragma once

#include <string_view>

namespace ckptfs {

bool natural_less(std::string_view a, std::string_view b);

}  // namespace ckptfs
