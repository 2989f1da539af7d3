// base/stats.h: the one Student t table and the 95% interval of a mean built on it.
#include "base/stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/types.h"

namespace commsched {
namespace {

TEST(StudentT95, MatchesPublishedQuantiles) {
  // Two-sided 95% (the 0.975 quantile), from any statistics table.
  EXPECT_DOUBLE_EQ(student_t95(1), 12.706);
  EXPECT_DOUBLE_EQ(student_t95(2), 4.303);
  EXPECT_DOUBLE_EQ(student_t95(9), 2.262);
  EXPECT_DOUBLE_EQ(student_t95(30), 2.042);
  EXPECT_NEAR(student_t95(40), 2.021, 0.001);
  EXPECT_NEAR(student_t95(60), 2.000, 0.001);
  EXPECT_NEAR(student_t95(120), 1.980, 0.001);
  EXPECT_NEAR(student_t95(100000), 1.960, 0.001);
}

TEST(StudentT95, FallsWithDegreesOfFreedomWithoutAJumpPastTheTable) {
  for (int dof = 1; dof < 200; ++dof) EXPECT_GT(student_t95(dof), student_t95(dof + 1)) << dof;
  EXPECT_LT(student_t95(30) - student_t95(31), 0.004);
}

TEST(StudentT95, RefusesNoDegreesOfFreedom) { EXPECT_THROW(student_t95(0), InvalidArgument); }

TEST(MeanCi95, IsTheMeanPlusMinusTTimesTheStandardError) {
  const std::vector<double> v = {1.0, 2.0, 3.0};  // mean 2, sample sd 1
  const MeanCi r = mean_ci95(v);
  EXPECT_DOUBLE_EQ(r.mean, 2.0);
  EXPECT_NEAR(r.half_width, 4.303 / std::sqrt(3.0), 1e-12);
}

TEST(MeanCi95, HasNoIntervalBelowTwoValues) {
  EXPECT_EQ(mean_ci95(std::vector<double>{}).half_width, 0.0);
  const MeanCi one = mean_ci95(std::vector<double>{5.0});
  EXPECT_EQ(one.mean, 5.0);
  EXPECT_EQ(one.half_width, 0.0);
}

}  // namespace
}  // namespace commsched
