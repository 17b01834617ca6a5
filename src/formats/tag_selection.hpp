// What the save dirs of several frameworks share: a tracker file naming the latest step, and a --tag
// option keeping one tag.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "ckptfs/error.hpp"
#include "formats/tag_names.hpp"

namespace ckptfs::formats {

// The text of a tracker file (Megatron-LM's and verl's latest_checkpointed_iteration.txt) without
// surrounding white space; nullopt when there is no such file.
std::optional<std::string> read_tracker(const std::filesystem::path& file);

// Keeps only the tag named `wanted` of `tags` (pairs of name and anything) and makes it `latest`. Throws
// SourceError naming `source` and listing the tags when there is none of that name.
template <typename Pairs>
void keep_only_tag(Pairs& tags, const std::string& wanted, const std::filesystem::path& source, std::string& latest) {
  auto it = std::find_if(tags.begin(), tags.end(), [&](const auto& t) { return t.first == wanted; });
  if (it == tags.end())
    throw SourceError(fmt::format("{}: no tag '{}' (tags: {})", source.string(), wanted, fmt::join(tag_names(tags), ", ")));
  auto kept = std::move(*it);
  tags.clear();
  tags.push_back(std::move(kept));
  latest = wanted;
}

// Makes `tracked` (the step a tracker file names, if it names one) `latest`. Throws FormatError naming
// `tracker` and the `what` ("iteration dir") it names when no tag of `tags` (pairs of name and anything)
// has that name.
template <typename Pairs>
void follow_tracker(const Pairs& tags, const std::optional<std::string>& tracked, const std::filesystem::path& tracker,
                    std::string_view what, std::string& latest) {
  if (!tracked) return;
  if (std::none_of(tags.begin(), tags.end(), [&](const auto& t) { return t.first == *tracked; }))
    throw FormatError(fmt::format("{}: names {} {}, which is missing or holds no checkpoint", tracker.string(), what,
                                  *tracked));
  latest = *tracked;
}

}  // namespace ckptfs::formats
