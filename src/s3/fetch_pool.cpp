#include "s3/fetch_pool.hpp"

#include <algorithm>

namespace ckptfs::s3 {

FetchPool::FetchPool(std::size_t threads) {
  for (std::size_t i = 0; i < std::max<std::size_t>(threads, 1); ++i)
    threads_.emplace_back([this] { work(); });
}

FetchPool::~FetchPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void FetchPool::submit(Priority priority, std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    (priority == Priority::read ? reads_ : prefetches_).push_back(std::move(job));
  }
  wake_.notify_one();
}

void FetchPool::work() {
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stopping_ || !reads_.empty() || !prefetches_.empty(); });
    if (stopping_) return;
    auto& queue = reads_.empty() ? prefetches_ : reads_;
    std::function<void()> job = std::move(queue.front());
    queue.pop_front();
    lock.unlock();
    job();
    lock.lock();
  }
}

}  // namespace ckptfs::s3
