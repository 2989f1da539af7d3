#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "scheduler/engine.h"
#include "scheduler/priority_credit_policy.h"
#include "scheduler/timeline.h"
#include "tests/unit/scheduler/test_backends.h"

namespace commsched {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()) + ".json")).string();
}

nlohmann::json load(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);  // throws on invalid JSON
}

TEST(Timeline, EngineTraceParsesAndHasSpans) {
  const std::string path = temp_path("engine_trace");
  {
    EngineConfig cfg;
    cfg.knobs = Knobs{1024, 4096};
    cfg.timeline_path = path;
    Engine engine(std::make_unique<PriorityCreditPolicy>(4096), std::make_shared<testing::RecordingBackend>(), cfg);
    std::vector<float> a(1000), b(10);
    Task t;
    t.name = "layer0.weight \"quoted\"";
    t.count = a.size();
    t.buffer.data = a.data();
    engine.submit(t);
    t.name = "layer1.bias";
    t.count = b.size();
    t.buffer.data = b.data();
    engine.submit(t);
    engine.wait_all();
    engine.backward_done();
  }
  const auto j = load(Timeline::rank_path(path, 0));
  ASSERT_TRUE(j.is_array());
  int queued = 0, comm = 0, parts = 0;
  for (const auto& e : j) {
    if (!e.contains("cat")) continue;
    if (e["cat"] == "queued" && e["ph"] == "b") ++queued;
    if (e["cat"] == "communicating" && e["ph"] == "b") ++comm;
    if (e["cat"] == "partition" && e["ph"] == "b") ++parts;
  }
  EXPECT_EQ(queued, 2);
  EXPECT_EQ(comm, 2);
  EXPECT_EQ(parts, 4 + 1);
  std::filesystem::remove(Timeline::rank_path(path, 0));
}

TEST(Timeline, ValidJsonAfterCrashMidRun) {
  const std::string path = temp_path("crash_trace");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    Timeline* tl = new Timeline(path, 3, 1000000);  // never destroyed: the process dies with it open
    for (int i = 0; i < 2000; ++i) tl->span("partition", "p" + std::to_string(i), i, i * 1000, i * 1000 + 500);
    ::_exit(1);  // no destructors, no flush
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  const auto j = load(Timeline::rank_path(path, 3));
  ASSERT_TRUE(j.is_array());
  EXPECT_GE(j.size(), 1000u) << "flushed batches survive the crash";
  std::filesystem::remove(Timeline::rank_path(path, 3));
}

TEST(Timeline, BoundedInSizeAndSaysSo) {
  const std::string path = temp_path("bounded_trace");
  {
    Timeline tl(path, 0, 100);
    for (int i = 0; i < 1000; ++i) tl.span("partition", "p", i, i, i + 1);
    EXPECT_EQ(tl.dropped(), 2 * 1000u - 100u);
  }
  const auto j = load(Timeline::rank_path(path, 0));
  EXPECT_LE(j.size(), 100u + 3u);
  EXPECT_EQ(j.back()["name"], "timeline_truncated");
  std::filesystem::remove(Timeline::rank_path(path, 0));
}

TEST(Timeline, UnwritablePathNamesIt) {
  try {
    Timeline tl("/nonexistent-dir/trace.json", 0, 10);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/trace.rank0.json"), std::string::npos);
  }
}

TEST(Timeline, RankGoesIntoTheFileName) {
  EXPECT_EQ(Timeline::rank_path("/tmp/trace.json", 3), "/tmp/trace.rank3.json");
  EXPECT_EQ(Timeline::rank_path("/tmp/trace", 0), "/tmp/trace.rank0");
  EXPECT_EQ(Timeline::rank_path("/tmp/a.b/trace", 1), "/tmp/a.b/trace.rank1");
  EXPECT_EQ(Timeline::rank_path("/tmp/t-{rank}/r{rank}.json", 2), "/tmp/t-2/r2.json");
}

TEST(Timeline, StopAndRestartWriteTwoValidFiles) {
  const std::string first = temp_path("restart_a"), second = temp_path("restart_b");
  {
    Timeline tl(Timeline::kDeferred, 1, 1000);
    EXPECT_EQ(tl.path(), "");
    tl.instant("before_start", 1);  // no file yet: discarded
    tl.restart(first);
    EXPECT_EQ(tl.path(), Timeline::rank_path(first, 1));
    tl.instant("in_first", 2);
    tl.stop();
    tl.instant("while_stopped", 3);
    EXPECT_EQ(Timeline::restart_all(second), 1u);  // this is the only live timeline
    tl.instant("in_second", 4);
  }
  const auto a = load(Timeline::rank_path(first, 1)), b = load(Timeline::rank_path(second, 1));
  auto names = [](const nlohmann::json& j) {
    std::vector<std::string> n;
    for (const auto& e : j) n.push_back(e["name"]);
    return n;
  };
  EXPECT_EQ(names(a), (std::vector<std::string>{"process_name", "clock_sync", "in_first"}));
  EXPECT_EQ(names(b), (std::vector<std::string>{"process_name", "clock_sync", "in_second"}));
  EXPECT_EQ(a[1]["args"]["rank"], 1);
  std::filesystem::remove(Timeline::rank_path(first, 1));
  std::filesystem::remove(Timeline::rank_path(second, 1));
}

}  // namespace
}  // namespace commsched
