// The catalogue of every option: names and variables are unique (Python keywords and CLI flags are the names), every
// layer's table is in it, and the README's table is the generated one.
#include <gtest/gtest.h>

#include <set>

#include "comm_backends/comm_backend.h"
#include "comm_backends/backend_registry.h"
#include "comm_backends/loopback/loopback_backend.h"
#include "comm_backends/ps/ps_config.h"
#include "plugins/api/option_catalogue.h"
#include "scheduler/stall.h"
#include "tests/unit/readme_section.h"
#include "tuner/tuner_config.h"

namespace commsched {
namespace {

TEST(OptionCatalogue, NamesAndVariablesAreUnique) {
  std::set<std::string> names, vars;
  for (const OptionInfo& o : all_options()) {
    EXPECT_TRUE(names.insert(o.name).second) << "option name " << o.name << " is used twice";
    for (const std::string& a : o.aliases) EXPECT_TRUE(names.insert(a).second) << "alias " << a << " is used twice";
    EXPECT_TRUE(vars.insert(o.env).second) << o.env << " is used twice";
    EXPECT_EQ(o.env.rfind("COMMSCHED_", 0), 0u) << o.env;
  }
  for (const char* v : {"COMMSCHED_POLICY", "COMMSCHED_BACKEND", "COMMSCHED_TUNE", "COMMSCHED_TUNER_TRIALS",
                        "COMMSCHED_TUNER_MIN_PARTITION", "COMMSCHED_PS_CHUNK_BYTES", "COMMSCHED_EMULATE_RATE",
                        "COMMSCHED_COLLECTIVE_FUSION_BYTES", "COMMSCHED_RANK", "COMMSCHED_TIMEOUT"})
    EXPECT_TRUE(vars.count(v)) << v << " is missing from the catalogue";
}

TEST(OptionCatalogue, EveryLayerReadsItsRows) {
  ::setenv("COMMSCHED_TUNER_MAX_PARTITION", "8MiB", 1);
  ::setenv("COMMSCHED_PS_CHUNK_BYTES", "1MiB", 1);
  ::setenv("COMMSCHED_BACKEND", "loopback", 1);
  EXPECT_EQ(tuner::TunerOptions::from_env().space["partition_bytes"].max, 8u << 20);
  EXPECT_EQ(PsConfig::from_env().chunk_bytes, 1u << 20);
  EXPECT_EQ(ContextEnvOptions::from_env().backend, "loopback");
  ::setenv("COMMSCHED_BACKEND", "carrier-pigeon", 1);
  try {
    ContextEnvOptions::from_env();
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("COMMSCHED_BACKEND='carrier-pigeon'"), std::string::npos) << m;
    EXPECT_NE(m.find("gloo"), std::string::npos) << m;
  }
  ::unsetenv("COMMSCHED_BACKEND");
  ::unsetenv("COMMSCHED_PS_CHUNK_BYTES");
  ::unsetenv("COMMSCHED_TUNER_MAX_PARTITION");
}

// Horovod's tuning switch and tuner log, below commsched's own variables.
TEST(OptionCatalogue, HorovodsAutotuneVariablesAreHonoured) {
  ::setenv("HOROVOD_AUTOTUNE", "1", 1);
  ::setenv("HOROVOD_AUTOTUNE_LOG", "/tmp/tune.csv", 1);
  EXPECT_TRUE(ContextEnvOptions::from_env().tune);
  EXPECT_EQ(tuner::TunerOptions::from_env().csv_path, "/tmp/tune.csv");
  ::setenv("COMMSCHED_TUNE", "0", 1);
  EXPECT_FALSE(ContextEnvOptions::from_env().tune);
  ::unsetenv("COMMSCHED_TUNE");
  ::unsetenv("HOROVOD_AUTOTUNE");
  ::unsetenv("HOROVOD_AUTOTUNE_LOG");
}

// Horovod's stall inspector settings (seconds), below commsched's own variables; its DISABLE switch turns the
// inspector off.
TEST(OptionCatalogue, HorovodsStallVariablesAreHonoured) {
  ::setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "30", 1);
  ::setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "120", 1);
  StallOptions o = StallOptions::from_env();
  EXPECT_EQ(o.check_s, 30);
  EXPECT_EQ(o.shutdown_s, 120);
  ::setenv("HOROVOD_STALL_CHECK_DISABLE", "1", 1);
  EXPECT_EQ(StallOptions::from_env().check_s, 0);
  EXPECT_EQ(StallOptions::from_env().shutdown_s, 0);
  ::setenv("COMMSCHED_STALL_CHECK", "5s", 1);
  EXPECT_EQ(StallOptions::from_env().check_s, 5);
  ::setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "soon", 1);
  try {
    StallOptions::from_env();
    ADD_FAILURE() << "a bad HOROVOD_STALL_SHUTDOWN_TIME_SECONDS was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"), std::string::npos) << e.what();
  }
  for (const char* v : {"HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
                        "HOROVOD_STALL_CHECK_DISABLE", "COMMSCHED_STALL_CHECK"})
    ::unsetenv(v);
  EXPECT_EQ(StallOptions::from_env().check_s, 60);
}

// The backend registry says what a backend object answers.
TEST(BackendRegistry, LoopbackRowMatchesTheBackend) {
  const BackendInfo* info = find_backend("loopback");
  ASSERT_NE(info, nullptr);
  EXPECT_TRUE(info->available);
  const auto backend = make_loopback_group(1).front();
  for (Op op : {Op::push_pull, Op::allreduce, Op::broadcast})
    for (Device d : {Device::cpu, Device::cuda}) {
      const bool listed = std::count(info->ops.begin(), info->ops.end(), op) &&
                          std::count(info->devices.begin(), info->devices.end(), d);
      EXPECT_EQ(listed, backend->supports(op, d)) << op_name(op);
    }
  EXPECT_EQ(find_backend("carrier-pigeon"), nullptr);
}

// A backend that says only its name: what supports() answers comes from the registry row of that name.
class NamedOnly final : public CommBackend {
 public:
  explicit NamedOnly(std::string_view name) : name_(name) {}
  std::string_view name() const override { return name_; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void do_start(std::vector<PartitionView>, BatchDone /*sent*/, BatchDone done) override { done(Status::Ok()); }
  void shutdown() override {}

 private:
  std::string_view name_;
};

TEST(BackendRegistry, SupportsAnswersFromTheRowOfTheBackendsName) {
  int carried = 0;
  for (const BackendInfo& row : backend_registry()) {
    const NamedOnly backend(row.name);
    for (Op op : {Op::push_pull, Op::allreduce, Op::broadcast})
      for (Device d : {Device::cpu, Device::cuda}) {
        const bool listed = std::count(row.ops.begin(), row.ops.end(), op) &&
                            std::count(row.devices.begin(), row.devices.end(), d);
        EXPECT_EQ(backend.supports(op, d), listed) << row.name << " " << op_name(op);
        carried += listed;
      }
  }
  EXPECT_GT(carried, 0);
  const NamedOnly stranger("carrier-pigeon");
  EXPECT_FALSE(stranger.supports(Op::allreduce, Device::cpu));  // no row: carries nothing
  EXPECT_TRUE(find_backend("gloo")->carries(Op::allreduce, Device::cpu));
  EXPECT_FALSE(find_backend("gloo")->carries(Op::push_pull, Device::cpu));
  EXPECT_FALSE(find_backend("nccl")->carries(Op::allreduce, Device::cpu));
}

TEST(OptionCatalogue, ReadmeTableIsTheGeneratedOne) {
  EXPECT_EQ(testing::readme_section("options"), options_markdown())
      << "README.md's options table differs from the registry: replace the lines between <!-- options:begin --> and "
         "<!-- options:end --> with the output of `build/plugins/commsched options --markdown`";
}

}  // namespace
}  // namespace commsched
