#include "s3/handle_pool.hpp"

#include <new>

namespace ckptfs::s3 {

HandlePool::HandlePool() {
  // curl_global_init is not thread-safe before 7.84: once, before any handle exists.
  static const CURLcode init = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (init != CURLE_OK) throw std::bad_alloc();
}

HandlePool::~HandlePool() {
  for (CURL* h : idle_) curl_easy_cleanup(h);
}

HandlePool::Lease HandlePool::take() {
  {
    std::lock_guard lock(mutex_);
    if (!idle_.empty()) {
      CURL* h = idle_.back();
      idle_.pop_back();
      return Lease(*this, h);
    }
  }
  CURL* h = curl_easy_init();
  if (!h) throw std::bad_alloc();
  return Lease(*this, h);
}

void HandlePool::give_back(CURL* handle) {
  curl_easy_reset(handle);  // options cleared, the live connection kept
  std::lock_guard lock(mutex_);
  idle_.push_back(handle);
}

}  // namespace ckptfs::s3
