#include "workload/profile.h"

#include <gtest/gtest.h>

namespace commsched::sim {
namespace {

TEST(Profile, ParsesAndGroupsLayers) {
  const auto p = parse_profile(R"({"name": "m", "batch_size": 32, "tensors": [
      {"name": "a.w", "layer": 0, "dtype": "f32", "elements": 10, "forward_ms": 1.5, "backward_ms": 3},
      {"name": "a.b", "layer": 0, "dtype": "f32", "elements": 2, "forward_ms": 0, "backward_ms": 0},
      {"name": "b.w", "layer": 1, "dtype": "f16", "elements": 8, "forward_ms": 0.5, "backward_ms": 1}]})",
                               "test");
  EXPECT_EQ(p.name, "m");
  ASSERT_EQ(p.layers.size(), 2u);
  EXPECT_EQ(p.layers[0].tensors, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(p.layers[0].forward, 1'500'000);
  EXPECT_EQ(p.total_bytes(), 10 * 4 + 2 * 4 + 8 * 2u);
  EXPECT_EQ(p.compute_per_iteration(), 6'000'000);
}

TEST(Profile, RejectsLayersOutOfForwardOrder) {
  try {
    parse_profile(R"({"tensors": [{"name": "x", "layer": 3, "elements": 1}, {"name": "y", "layer": 1, "elements": 1}]})",
                  "bad");
    FAIL() << "accepted layers out of order";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'y'"), std::string::npos) << e.what();
  }
}

TEST(Profile, RejectsMalformedInputNamingTheEntry) {
  EXPECT_THROW(parse_profile("{not json", "x"), InvalidArgument);
  EXPECT_THROW(parse_profile(R"({"tensors": []})", "x"), InvalidArgument);
  try {
    parse_profile(R"({"tensors": [{"name": "t", "layer": 0, "elements": 1, "forward_ms": -1}]})", "x");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'t'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_profile("/nonexistent/profile.json"), InvalidArgument);
}

// Found by fuzz_profile_json (UBSan): a count written as a float out of an integer's range (1e82) was cast to it,
// undefined behaviour. Whole-number fields take integers in range only, naming the field.
TEST(Profile, RejectsCountsThatAreNotWholeNumbersInRange) {
  for (const char* bad : {R"("elements": 1e82, "layer": 0)", R"("elements": 1.5, "layer": 0)",
                          R"("elements": 4, "layer": 1e12)", R"("elements": 18446744073709551615, "layer": 0)"}) {
    try {
      parse_profile(std::string(R"({"tensors": [{"name": "t", )") + bad + "}]}", "x");
      FAIL() << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("must be a whole number"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parse_profile(R"({"batch_size": 1e40, "tensors": [{"name": "t", "layer": 0, "elements": 1}]})", "x"),
               InvalidArgument);
}

// The committed profiles load and have the published parameter counts.
TEST(Profile, CommittedProfilesHaveThePublishedSizes) {
  const std::pair<const char*, double> expected[] = {
      {"vgg16", 138.36e6}, {"resnet50", 25.56e6}, {"bert-base", 109.48e6}, {"bert-large", 335.14e6},
      {"transformer-base", 63.08e6}};
  for (const auto& [name, params] : expected) {
    const auto p = load_profile(std::string(COMMSCHED_PROFILES_DIR) + "/" + name + ".json");
    EXPECT_NEAR(p.total_bytes() / 4.0, params, 0.01e6) << name;
    EXPECT_GT(p.compute_per_iteration(), 0) << name;
  }
}

}  // namespace
}  // namespace commsched::sim
