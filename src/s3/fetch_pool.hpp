// A fixed set of worker threads running jobs from two queues: jobs a reader waits on first, prefetches
// after. With one thread per allowed connection, at most that many GETs are in flight.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ckptfs::s3 {

class FetchPool {
 public:
  enum class Priority { read, prefetch };

  explicit FetchPool(std::size_t threads);
  // Lets the running jobs finish, drops the queued ones, joins the threads.
  ~FetchPool();
  FetchPool(const FetchPool&) = delete;
  FetchPool& operator=(const FetchPool&) = delete;

  // Jobs must not throw (they report their own failures).
  void submit(Priority priority, std::function<void()> job);

 private:
  void work();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> reads_, prefetches_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace ckptfs::s3
