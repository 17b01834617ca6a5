#include "io/change_watch.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "io/runtime.hpp"
#include "vfs/test_files.hpp"

namespace ckptfs::io {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// Runs `act` on a thread of its own a moment after the watch has begun waiting.
template <class Act>
std::jthread in_a_moment(Act act) {
  return std::jthread([act] {
    std::this_thread::sleep_for(100ms);
    act();
  });
}

TEST(ChangeWatch, AFileWrittenTwoLevelsDownIsSeen) {
  testing::TempDir dir;
  fs::create_directories(dir.path() / "step-1" / "model");
  Runtime runtime;
  ChangeWatch watch(*runtime.open_local(dir.path()), 3600s);
  ASSERT_EQ(watch.polling_because(), "");
  auto writer = in_a_moment([&] { std::ofstream(dir.path() / "step-1" / "model" / ".metadata") << "x"; });
  std::stop_source stop;
  EXPECT_TRUE(watch.wait(stop.get_token()));
}

TEST(ChangeWatch, ADirectoryMadeAfterTheWatchIsWatchedToo) {
  testing::TempDir dir;
  Runtime runtime;
  ChangeWatch watch(*runtime.open_local(dir.path()), 3600s);
  std::stop_source stop;
  auto writer = in_a_moment([&] { fs::create_directories(dir.path() / "step-2"); });
  EXPECT_TRUE(watch.wait(stop.get_token()));
  writer.join();
  auto second = in_a_moment([&] { std::ofstream(dir.path() / "step-2" / "trainer_state.json") << "{}"; });
  EXPECT_TRUE(watch.wait(stop.get_token()));
}

TEST(ChangeWatch, AStopEndsTheWait) {
  testing::TempDir dir;
  Runtime runtime;
  ChangeWatch watch(*runtime.open_local(dir.path()), 3600s);
  std::stop_source stop;
  auto stopper = in_a_moment([&] { stop.request_stop(); });
  EXPECT_FALSE(watch.wait(stop.get_token()));
}

}  // namespace
}  // namespace ckptfs::io
