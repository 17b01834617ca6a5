// libcurl easy handles kept between requests: each keeps its connection to the store open (keep-alive), so a
// request reuses a warm connection instead of paying a TCP handshake. Any thread takes one, uses it alone,
// and gives it back.
#pragma once

#include <curl/curl.h>

#include <mutex>
#include <vector>

namespace ckptfs::s3 {

class HandlePool {
 public:
  HandlePool();
  ~HandlePool();
  HandlePool(const HandlePool&) = delete;
  HandlePool& operator=(const HandlePool&) = delete;

  class Lease {
   public:
    Lease(HandlePool& pool, CURL* handle) : pool_(pool), handle_(handle) {}
    ~Lease() { pool_.give_back(handle_); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    CURL* get() const { return handle_; }

   private:
    HandlePool& pool_;
    CURL* handle_;
  };

  Lease take();

 private:
  void give_back(CURL* handle);

  std::mutex mutex_;
  std::vector<CURL*> idle_;
};

}  // namespace ckptfs::s3
