// resolve_profile_path: the one place a profile argument ("vgg16", a folder of the caller's, or a file) becomes a file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "base/types.h"
#include "workload/profile.h"

namespace commsched::sim {
namespace {

namespace fs = std::filesystem;
const std::string kProfiles = std::string(COMMSCHED_SOURCE_DIR) + "/workload/profiles";

// A temporary folder holding one profile named `name`, removed at the end of the test.
class ProfileDir {
 public:
  explicit ProfileDir(const std::string& name)
      : dir_(fs::temp_directory_path() / ("commsched-profiles-" + std::to_string(::testing::UnitTest::GetInstance()
                                                                                       ->random_seed()) +
                                          "-" + name)) {
    fs::create_directories(dir_);
    std::ofstream(dir_ / (name + ".json"))
        << R"({"name": "mine", "tensors": [{"name": "w", "layer": 0, "elements": 8}]})";
  }
  ~ProfileDir() { fs::remove_all(dir_); }
  std::string str() const { return dir_.string(); }

 private:
  fs::path dir_;
};

TEST(ProfileResolution, ANameResolvesInTheSourceTreesProfiles) {
  EXPECT_EQ(fs::canonical(resolve_profile_path("resnet50")), fs::canonical(kProfiles + "/resnet50.json"));
  EXPECT_EQ(load_profile(resolve_profile_path("vgg16")).name, load_profile(kProfiles + "/vgg16.json").name);
}

TEST(ProfileResolution, ACallersFolderIsSearchedFirstAndFilesPassThrough) {
  const ProfileDir mine("resnet50");  // shadows the committed profile of that name
  const std::string found = resolve_profile_path("resnet50", {mine.str()});
  EXPECT_EQ(fs::path(found).parent_path(), fs::path(mine.str()));
  EXPECT_EQ(load_profile(found).name, "mine");
  EXPECT_EQ(resolve_profile_path(found), found);  // an existing file is taken as it is
  EXPECT_EQ(resolve_profile_path("vgg16", {mine.str()}), kProfiles + "/vgg16.json");  // falls through to the tree
}

TEST(ProfileResolution, AnUnknownNameIsNamedWithEveryFolderAndTheNamesThere) {
  const ProfileDir mine("tiny-model");
  try {
    resolve_profile_path("no-such-model", {mine.str()});
    FAIL() << "an unknown profile resolved";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'no-such-model'"), std::string::npos) << what;
    EXPECT_NE(what.find(mine.str()), std::string::npos) << what;
    EXPECT_NE(what.find(kProfiles), std::string::npos) << what;
    EXPECT_NE(what.find("tiny-model"), std::string::npos) << what;
    EXPECT_NE(what.find("resnet50"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace commsched::sim
