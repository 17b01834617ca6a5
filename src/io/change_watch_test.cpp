#include "io/change_watch.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "vfs/test_files.hpp"

namespace ckptfs::io {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

TEST(ChangeWatch, AFileWrittenTwoLevelsDownIsSeen) {
  testing::TempDir dir;
  fs::create_directories(dir.path() / "step-1" / "model");
  ChangeWatch watch(dir.path(), 3600s);
  ASSERT_EQ(watch.polling_because(), "");
  std::jthread writer([&] {
    std::this_thread::sleep_for(100ms);
    std::ofstream(dir.path() / "step-1" / "model" / ".metadata") << "x";
  });
  std::stop_source stop;
  EXPECT_TRUE(watch.wait(stop.get_token()));
}

TEST(ChangeWatch, ADirectoryMadeAfterTheWatchIsWatchedToo) {
  testing::TempDir dir;
  ChangeWatch watch(dir.path(), 3600s);
  std::stop_source stop;
  std::jthread writer([&] {
    std::this_thread::sleep_for(100ms);
    fs::create_directories(dir.path() / "step-2");
  });
  EXPECT_TRUE(watch.wait(stop.get_token()));
  writer.join();
  std::jthread second([&] {
    std::this_thread::sleep_for(100ms);
    std::ofstream(dir.path() / "step-2" / "trainer_state.json") << "{}";
  });
  EXPECT_TRUE(watch.wait(stop.get_token()));
}

TEST(ChangeWatch, AStopEndsTheWait) {
  testing::TempDir dir;
  ChangeWatch watch(dir.path(), 3600s);
  std::stop_source stop;
  std::jthread stopper([&] {
    std::this_thread::sleep_for(100ms);
    stop.request_stop();
  });
  EXPECT_FALSE(watch.wait(stop.get_token()));
}

}  // namespace
}  // namespace ckptfs::io
