// The index file: a header naming what it was written for (index format, the writing ckptfs's build id,
// the key: version, source and options), then the encoded checkpoint as one LZ4 frame (liblz4's frame
// format, lz4frame.h) with its block and content checksums, so a damaged byte anywhere is found before
// decoding: a changed header is another key, a changed frame byte fails a checksum.
#pragma once

#include <string>
#include <string_view>

namespace ckptfs::index {

struct IndexKey {
  std::string build_id;  // build_id() of the ckptfs that writes or reads it
  std::string key;       // "ckptfs VERSION", the source, the options
};

// Bump whenever the encoding changes (checkpoint_fields.hpp). A change in what indexing produces needs
// no bump: it comes with a new build, and every build has its own build id.
inline constexpr uint64_t kFormatVersion =
    11;  // 11: a value's native as a closed variant (storages too); 10: tensors' model roles; 9: the saves in
         // progress; 8: a file's expectations not yet checked; 7: remote objects (ETags, listing states); 6:
         // DeepSpeed's part of a tag; 5: field lists, LZ4 frame, build id; 4: tensor handles

std::string pack_index(const IndexKey& key, std::string_view body);

// The body of the index `file` written for `key`. Throws StaleIndex when it was written by another
// format, build or for another key, FormatError when it is damaged or not an index.
std::string unpack_index(std::string_view file, const IndexKey& key);

}  // namespace ckptfs::index
