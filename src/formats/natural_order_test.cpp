#include "formats/natural_order.hpp"

#include <gtest/gtest.h>

namespace ckptfs {
namespace {

TEST(NaturalOrder, DigitRunsCompareAsNumbers) {
  EXPECT_TRUE(natural_less("global_step9", "global_step10"));
  EXPECT_FALSE(natural_less("global_step10", "global_step9"));
  EXPECT_TRUE(natural_less("zero_pp_rank_2_mp", "zero_pp_rank_10_mp"));
  EXPECT_TRUE(natural_less("step007", "step10"));
  EXPECT_FALSE(natural_less("step10", "step010"));
  EXPECT_FALSE(natural_less("a", "a"));
  EXPECT_TRUE(natural_less("a", "ab"));
  EXPECT_TRUE(natural_less("checkpoint-500", "checkpoint-1000"));
}

TEST(NaturalOrder, ATrackerReachesWhatComesNoLaterInItsSeries) {
  EXPECT_TRUE(same_series("global_step9", "global_step10"));
  EXPECT_FALSE(same_series("global_step9", "global_step9_universal"));
  EXPECT_FALSE(same_series("global_step9", "best"));
  EXPECT_TRUE(tracker_reached("global_step10", "global_step9"));
  EXPECT_TRUE(tracker_reached("global_step10", "global_step10"));
  EXPECT_FALSE(tracker_reached("global_step10", "global_step11"));
  EXPECT_TRUE(tracker_reached("global_step10", "global_step10_universal"));  // another series
  EXPECT_TRUE(tracker_reached("best", "global_step11"));
}

}  // namespace
}  // namespace ckptfs
