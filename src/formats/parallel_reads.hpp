// Reading many rank files at once: on Lustre, GPFS or NFS every open and every read of a pickle costs
// milliseconds, and a tag of 1,024 ranks read one file after another pays them in series.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

namespace ckptfs::formats {

// Up to this many rank files are read at once: enough to keep a network filesystem busy, few enough that
// the parsed pickles held at once stay small.
inline constexpr size_t kParallelReads = 8;

// read(item) for every item, on up to kParallelReads threads; the results in item order. When reads
// throw, the exception of the first such item is rethrown (the one a serial loop would have met).
template <typename Item, typename Read>
auto read_all(const std::vector<Item>& items, Read read)
    -> std::vector<std::invoke_result_t<Read, const Item&>> {
  using Result = std::invoke_result_t<Read, const Item&>;
  std::vector<std::optional<Result>> results(items.size());
  std::vector<std::exception_ptr> errors(items.size());
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t i = next++; i < items.size(); i = next++) {
      try {
        results[i] = read(items[i]);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  std::vector<std::jthread> threads;
  for (size_t t = 1; t < std::min(kParallelReads, items.size()); ++t) threads.emplace_back(work);
  work();
  threads.clear();  // joins
  std::vector<Result> out;
  out.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (errors[i]) std::rethrow_exception(errors[i]);
    out.push_back(std::move(*results[i]));
  }
  return out;
}

}  // namespace ckptfs::formats
