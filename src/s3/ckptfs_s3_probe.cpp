// A test hook, not part of the product (built with the tests, never installed): drives s3::Client from the
// command line so that mount_tests/test_s3_client.py can exercise it against a real gateway.
//
//   ckptfs_s3_probe [--endpoint URL] [--region R] [--no-sign] list s3://BUCKET/PREFIX [MAX_KEYS]
//   ckptfs_s3_probe [...] head s3://BUCKET/KEY
//   ckptfs_s3_probe [...] get s3://BUCKET/KEY OFFSET LENGTH [ETAG [THREADS]]
//   ckptfs_s3_probe [...] watch s3://BUCKET/KEY OFFSET LENGTH ETAG SECONDS
//   ckptfs_s3_probe [...] cached s3://BUCKET/KEY [etag=E] [memory_kb=N] [block_kb=N] [connections=N]
//                                                [dir=D] [dir_kb=N]
//
// list and head print JSON (one object per line), get writes the bytes to stdout (read as THREADS
// contiguous parts at once, one thread each, all through the one client); watch repeats the get
// with one client (its pooled connections) for SECONDS, printing one JSON line per read: {"start_ms",
// "ms", "ok", "bytes" (hex) or "error"}. cached reads through an s3::BlockCache over the object (its size and
// ETag from a HEAD, or pinned to etag=E) the commands of stdin, one a line, answering one JSON line each:
// "read OFFSET LENGTH PATH [CHUNK [THREADS]]" (THREADS readers each read the range in CHUNK-byte reads; the
// bytes go to PATH), "prefetch OFFSET LENGTH", "stats". The last stderr line is "requests=N retries=M".
// Credentials come from the environment as for ckptfs. Exit 0, 2 usage, 3 an s3::Error (its message, then
// "code=CODE status=HTTP"), 10 ObjectChangedError.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ckptfs/s3.hpp"
#include "ckptfs/s3_cache.hpp"

namespace {

using namespace ckptfs;

nlohmann::json to_json(const s3::ObjectInfo& o) {
  return {{"key", o.key}, {"size", o.size}, {"etag", o.etag}, {"last_modified", o.last_modified}};
}

void parallel_get(s3::Client& client, const s3::Url& url, std::uint64_t offset, std::vector<std::byte>& out,
                  const std::string& etag, int threads) {
  std::uint64_t part = (out.size() + threads - 1) / threads;
  std::vector<std::thread> readers;
  std::vector<std::exception_ptr> failures(threads);
  for (int i = 0; i < threads; ++i) {
    std::uint64_t begin = std::min<std::uint64_t>(i * part, out.size()),
                  end = std::min(begin + part, out.size());
    readers.emplace_back([&, i, begin, end] {
      try {
        client.get_range(url.bucket, url.prefix, offset + begin, end - begin, etag, out.data() + begin);
      } catch (...) {
        failures[i] = std::current_exception();
      }
    });
  }
  for (auto& t : readers) t.join();
  for (auto& f : failures)
    if (f) std::rethrow_exception(f);
}

// Reads the range again and again: how a live mount sees the store go away and come back.
void watch(s3::Client& client, const s3::Url& url, std::uint64_t offset, std::uint64_t length,
           const std::string& etag, double seconds) {
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
  };
  const auto begin = Clock::now();
  std::vector<std::byte> bytes(length);
  while (ms_since(begin) < seconds * 1000) {
    auto start = Clock::now();
    nlohmann::json line{{"start_ms", ms_since(begin)}};
    try {
      client.get_range(url.bucket, url.prefix, offset, length, etag, bytes.data());
      std::string hex;
      for (std::byte b : bytes) hex += fmt::format("{:02x}", static_cast<unsigned>(b));
      line["ok"] = true;
      line["bytes"] = hex;
    } catch (const s3::Error& e) {
      line["ok"] = false;
      line["error"] = e.what();
    }
    line["ms"] = ms_since(start);
    fmt::print("{}\n", line.dump());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

nlohmann::json cached_read(s3::BlockCache& cache, const s3::ObjectId& object, std::istringstream& words) {
  std::uint64_t offset = 0, length = 0, chunk = 0;
  int threads = 1;
  std::string path;
  words >> offset >> length >> path >> chunk >> threads;
  chunk = chunk ? chunk : std::max<std::uint64_t>(length, 1);
  std::vector<std::vector<std::byte>> copies(std::max(threads, 1), std::vector<std::byte>(length));
  std::vector<std::exception_ptr> failures(copies.size());
  std::vector<std::thread> readers;
  for (std::size_t t = 0; t < copies.size(); ++t)
    readers.emplace_back([&, t] {
      try {
        for (std::uint64_t at = 0; at < length; at += chunk)
          cache.read(object, offset + at, std::span(copies[t]).subspan(at, std::min(chunk, length - at)));
      } catch (...) {
        failures[t] = std::current_exception();
      }
    });
  for (auto& r : readers) r.join();
  for (auto& f : failures)
    if (f) std::rethrow_exception(f);
  for (const auto& c : copies)
    if (c != copies[0]) return {{"ok", false}, {"error", "readers of one range got different bytes"}};
  std::FILE* out = std::fopen(path.c_str(), "wb");
  bool written = out && std::fwrite(copies[0].data(), 1, length, out) == length;
  if (out) written = std::fclose(out) == 0 && written;
  return {{"ok", written}};
}

// The block cache driven line by line from stdin, so that a test can stop the store between two reads.
void cached(s3::Client& client, const s3::Url& url, const std::vector<std::string>& settings) {
  s3::ObjectId object = s3::object_id(url.bucket, client.head(url.bucket, url.prefix));
  s3::BlockCacheOptions options;
  for (const std::string& setting : settings) {
    auto eq = setting.find('=');
    std::string name = setting.substr(0, eq), value = setting.substr(eq + 1);
    if (name == "etag")
      object.etag = value;
    else if (name == "memory_kb")
      options.memory_bytes = std::stoull(value) << 10;
    else if (name == "block_kb")
      options.block_bytes = std::stoull(value) << 10;
    else if (name == "connections")
      options.connections = std::stoul(value);
    else if (name == "dir")
      options.dir = value;
    else if (name == "dir_kb")
      options.dir_bytes = std::stoull(value) << 10;
    else
      throw std::invalid_argument("unknown setting " + setting);
  }
  s3::BlockCache cache(std::shared_ptr<s3::Client>(&client, [](s3::Client*) {}), options);
  fmt::print("{}\n", nlohmann::json{{"etag", object.etag}, {"size", object.size}}.dump());
  std::fflush(stdout);
  for (std::string line; std::getline(std::cin, line);) {
    std::istringstream words(line);
    std::string command;
    words >> command;
    nlohmann::json answer;
    try {
      if (command == "read") {
        answer = cached_read(cache, object, words);
      } else if (command == "prefetch") {
        std::uint64_t offset = 0, length = 0;
        words >> offset >> length;
        cache.prefetch(object, offset, length);
        answer = {{"ok", true}};
      } else if (command == "stats") {
        answer = cache.stats();
        answer["ok"] = true;
      } else {
        answer = {{"ok", false}, {"error", "unknown command " + command}};
      }
    } catch (const s3::Error& e) {
      answer = {{"ok", false},
                {"error", e.what()},
                {"code", e.code()},
                {"changed", dynamic_cast<const s3::ObjectChangedError*>(&e) != nullptr}};
    }
    fmt::print("{}\n", answer.dump());
    std::fflush(stdout);
  }
}

int run(s3::Client& client, const std::vector<std::string>& args) {
  const std::string& command = args.at(0);
  s3::Url url = s3::parse_url(args.at(1));
  if (command == "list") {
    int max_keys = args.size() > 2 ? std::stoi(args[2]) : 0;
    for (const auto& o : client.list(url.bucket, url.prefix, max_keys)) fmt::print("{}\n", to_json(o).dump());
  } else if (command == "head") {
    fmt::print("{}\n", to_json(client.head(url.bucket, url.prefix)).dump());
  } else if (command == "get" && args.size() >= 4) {
    std::uint64_t offset = std::stoull(args[2]), length = std::stoull(args[3]);
    std::vector<std::byte> bytes(length);
    parallel_get(client, url, offset, bytes, args.size() > 4 ? args[4] : "",
                 args.size() > 5 ? std::stoi(args[5]) : 1);
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
  } else if (command == "cached") {
    cached(client, url, std::vector<std::string>(args.begin() + 2, args.end()));
  } else if (command == "watch" && args.size() >= 6) {
    watch(client, url, std::stoull(args[2]), std::stoull(args[3]), args[4], std::stod(args[5]));
  } else {
    throw std::invalid_argument("unknown command");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  s3::Options options;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--endpoint" && i + 1 < argc)
      options.endpoint = argv[++i];
    else if (a == "--region" && i + 1 < argc)
      options.region = argv[++i];
    else if (a == "--no-sign")
      options.no_sign = true;
    else
      args.push_back(a);
  }
  if (args.size() < 2) {
    fmt::print(stderr,
               "usage: ckptfs_s3_probe [--endpoint URL] [--region R] [--no-sign] list|head|get URL ...\n");
    return 2;
  }
  int rc = 0;
  std::unique_ptr<s3::Client> client;
  try {
    client = std::make_unique<s3::Client>(s3::resolve_config(options));
    rc = run(*client, args);
  } catch (const s3::ObjectChangedError& e) {
    fmt::print(stderr, "ckptfs_s3_probe: {}\ncode={} status={}\n", e.what(), e.code(), e.http_status());
    rc = 10;
  } catch (const s3::Error& e) {
    fmt::print(stderr, "ckptfs_s3_probe: {}\ncode={} status={}\n", e.what(), e.code(), e.http_status());
    rc = 3;
  } catch (const ckptfs::Error& e) {
    fmt::print(stderr, "ckptfs_s3_probe: {}\n", e.what());
    rc = 3;
  } catch (const std::exception& e) {
    fmt::print(stderr, "ckptfs_s3_probe: {}: {}\n", args[0], e.what());
    return 2;
  }
  if (client) fmt::print(stderr, "requests={} retries={}\n", client->requests(), client->retries());
  return rc;
}
