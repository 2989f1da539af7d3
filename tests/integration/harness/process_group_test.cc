// ProcessGroup, the one mechanism behind the launcher, the benches' rank processes and LocalCluster.
#include "plugins/launch/process_group.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace commsched {
namespace {

using namespace std::chrono_literals;

bool running(pid_t pid) { return ::kill(pid, 0) == 0; }

// A fresh folder, removed with what is in it when the test ends, however it ends.
struct TempDir {
  std::string path = make();
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
  static std::string make() {
    char dir[] = "/tmp/commsched-pg-test-XXXXXX";
    if (::mkdtemp(dir) == nullptr) throw std::runtime_error(std::string("mkdtemp: ") + std::strerror(errno));
    return dir;
  }
};

// A pipe opened without O_CLOEXEC, closed when the test ends.
struct Pipe {
  int fds[2] = {-1, -1};
  Pipe() {
    if (::pipe(fds) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  ~Pipe() { ::close(fds[0]), ::close(fds[1]); }
};

// A variable of this process's environment, removed when the test ends.
struct ParentVariable {
  std::string name;
  ParentVariable(std::string n, const char* value) : name(std::move(n)) { ::setenv(name.c_str(), value, 1); }
  ~ParentVariable() { ::unsetenv(name.c_str()); }
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(ProcessGroup, ReportsExitCodesSignalsAndWritesLogsWithTheEnvironment) {
  const TempDir dir;
  const std::string log = dir / "a.log";
  ProcessGroup g;
  g.spawn({"exits 3", {"/bin/sh", "-c", "echo \"value=$PG_TEST_VALUE\"; exit 3"}, {{"PG_TEST_VALUE", "42"}}, log});
  g.spawn({"killed", {"/bin/sh", "-c", "kill -9 $$"}, {}, ""});
  g.spawn({"missing", {"/nonexistent/program"}, {}, dir / "b.log"});
  ASSERT_TRUE(g.wait_all(20s));
  EXPECT_EQ(g.members()[0].code, 3);
  EXPECT_EQ(g.members()[0].signal, 0);
  EXPECT_EQ(slurp(log), "value=42\n");
  EXPECT_EQ(g.members()[1].code, 128 + SIGKILL);
  EXPECT_EQ(g.members()[1].signal, SIGKILL);
  EXPECT_EQ(g.members()[2].code, 127);
  EXPECT_NE(slurp(dir / "b.log").find("cannot run '/nonexistent/program'"), std::string::npos);
}

// ProcessSpec::input reaches the child's stdin and ends there (the child sees end of file after it), also when it
// is larger than a pipe holds by default (the pipe is made to hold it), and also when the child never reads it or is
// gone before it could.
TEST(ProcessGroup, TheInputIsTheChildsStdinAndAChildThatIgnoresItDoesNotHurtTheParent) {
  const TempDir dir;
  const std::string log = dir / "c.log", counted = dir / "d.log";
  ProcessGroup g;
  ProcessSpec reads{"reads", {"/bin/sh", "-c", "IFS= read -r first; rest=$(cat); echo \"[$first][$rest]\""}, {}, log,
                    false, "a secret\nmore\n"};
  g.spawn(reads);
  g.spawn({"counts", {"/bin/sh", "-c", "wc -c"}, {}, counted, false, std::string(300000, 'x')});
  g.spawn({"gone", {"/nonexistent/program"}, {}, "", false, std::string(200000, 'x')});
  ASSERT_TRUE(g.wait_all(20s));
  EXPECT_EQ(g.members()[0].code, 0);
  EXPECT_EQ(slurp(log), "[a secret][more]\n");
  EXPECT_EQ(std::stoul(slurp(counted)), 300000u);
  EXPECT_EQ(g.members()[2].code, 127);
  EXPECT_THROW(g.spawn({"big", {"/bin/true"}, {}, "", false, std::string(kMaxProcessInput + 1, 'x')}),
               std::runtime_error);
}

// keep_input_open: the child reads its input, and end-of-file only once close_inputs() is called (what a remote host's
// launcher watches for through ssh). A later child does not hold the first one's pipe open.
TEST(ProcessGroup, AnInputKeptOpenEndsOnlyWhenClosed) {
  const TempDir dir;
  const std::string log = dir / "c.log";
  ProcessGroup g;
  ProcessSpec spec{"waits", {"/bin/sh", "-c", "IFS= read -r first; echo \"[$first]\"; cat; echo eof"}, {}, log, false,
                   "hello\n"};
  spec.keep_input_open = true;
  g.spawn(spec);
  g.spawn({"other", {"/bin/sleep", "30"}, {}, "", false, ""});
  for (int i = 0; i < 2000 && slurp(log).empty(); ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(slurp(log), "[hello]\n");
  EXPECT_FALSE(g.wait_all(200ms)) << "the child saw its stdin end before close_inputs()";
  g.close_inputs();
  for (int i = 0; i < 4000 && !g.members()[0].code; ++i) {
    g.reap();
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(g.members()[0].code, 0);
  EXPECT_EQ(slurp(log), "[hello]\neof\n");
  g.kill_all();
}

// A child holds none of the parent's descriptors past stderr, CLOEXEC or not (a parent's listening socket left open
// in a worker would keep its port and its peers' connections alive after the parent closed it), and a variable the
// spec sets replaces the parent's value of it instead of standing beside it.
TEST(ProcessGroup, AChildInheritsNoDescriptorsAndTheSpecsEnvironmentWins) {
  const Pipe pipe;  // no O_CLOEXEC: exec alone would pass both ends on
  const int* fds = pipe.fds;
  const ParentVariable var("PG_TEST_OVERRIDE", "parent");
  const TempDir dir;
  const std::string log = dir / "fds.log";
  const std::string script = "for fd in " + std::to_string(fds[0]) + " " + std::to_string(fds[1]) +
                             "; do [ -e /proc/$$/fd/$fd ] && echo \"open $fd\"; done; "
                             "env | grep -c '^PG_TEST_OVERRIDE='; echo \"$PG_TEST_OVERRIDE\"";
  ProcessGroup g;
  g.spawn({"fd probe", {"/bin/sh", "-c", script}, {{"PG_TEST_OVERRIDE", "spec"}}, log});
  ASSERT_TRUE(g.wait_all(20s));
  EXPECT_EQ(g.members()[0].code, 0);
  EXPECT_EQ(slurp(log), "1\nspec\n") << "descriptors " << fds[0] << " and " << fds[1] << " must not reach the child";
}

// Where close_range is missing or refused, the child closes what /proc/self/fd lists: every descriptor above stderr,
// stderr and below kept. Run in a forked child, as spawn runs it.
TEST(ProcessGroup, TheProcFallbackClosesEveryDescriptorAboveStderr) {
  const Pipe pipe;
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) {
    const int null = ::open("/dev/null", O_RDONLY);  // a third, past any gap
    const int high = ::dup2(null, 200);
    if (null < 0 || high != 200 || !close_listed_fds()) ::_exit(2);
    for (int fd : {pipe.fds[0], pipe.fds[1], null, high})
      if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) ::_exit(3);
    for (int fd : {0, 1, 2})
      if (::fcntl(fd, F_GETFD) == -1) ::_exit(4);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: the fallback did not run, 3: a descriptor above stderr stayed open, "
                                       "4: stdin, stdout or stderr was closed";
}

// A PATH the spec sets is the one the program is looked up on (the child's), not this process's.
TEST(ProcessGroup, AProgramIsFoundOnThePathTheSpecSets) {
  const TempDir dir;
  const std::string prog = dir / "pg-test-only-here", log = dir / "out.log";
  {
    std::ofstream f(prog);
    f << "#!/bin/sh\necho found\n";
  }
  ASSERT_EQ(::chmod(prog.c_str(), 0755), 0);
  ProcessGroup g;
  g.spawn({"on the spec's PATH", {"pg-test-only-here"}, {{"PATH", "/nonexistent:" + dir.path}}, log});
  ASSERT_TRUE(g.wait_all(20s));
  EXPECT_EQ(g.members()[0].code, 0);
  EXPECT_EQ(slurp(log), "found\n");
  // Not on the spec's PATH: not run, even though this process's PATH has a program of that name.
  g.spawn({"not on the spec's PATH", {"sh", "-c", "exit 0"}, {{"PATH", dir.path}}, log});
  ASSERT_TRUE(g.wait_all(20s));
  EXPECT_EQ(g.members()[1].code, 127);
  EXPECT_NE(slurp(log).find("cannot run 'sh'"), std::string::npos) << slurp(log);
}

// What becomes of a `sleep 60` spawned by a process that then dies without cleaning up (as a launcher killed with
// SIGKILL): judged in a forked "judge" process that adopts orphans (a subreaper), so the sleeper, once orphaned, is
// its child to wait for. Returns the signal that ended the sleeper, or 0 when it outlived its parent (by 1 s).
int fate_of_an_orphan(bool dies_with_parent) {
  const pid_t judge = ::fork();
  if (judge < 0) return -1;
  if (judge == 0) {
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    int fds[2];
    if (::pipe(fds) != 0) ::_exit(100);
    const pid_t parent = ::fork();
    if (parent == 0) {  // spawns the sleeper, tells its pid, dies without the group's destructor once it runs
      const TempDir dir;
      const std::string ready = dir / "ready";
      ProcessGroup g;
      ProcessSpec spec{"sleeper", {"/bin/sh", "-c", "touch " + ready + "; exec sleep 60"}, {}, ""};
      spec.dies_with_parent = dies_with_parent;
      const pid_t sleeper = g.member(g.spawn(spec)).pid;
      (void)!::write(fds[1], &sleeper, sizeof sleeper);
      // Past exec: a parent gone before the child's prctl is the other path (the child exits by itself).
      for (int i = 0; i < 1000 && ::access(ready.c_str(), F_OK) != 0; ++i) std::this_thread::sleep_for(10ms);
      std::filesystem::remove_all(dir.path);  // _exit runs no destructor
      ::_exit(0);
    }
    pid_t sleeper = -1;
    if (parent < 0 || ::read(fds[0], &sleeper, sizeof sleeper) != sizeof sleeper) ::_exit(101);
    ::waitpid(parent, nullptr, 0);
    for (int i = 0; i < (dies_with_parent ? 1000 : 100); ++i) {  // up to 10 s for the kill, 1 s to outlive
      int status = 0;
      if (::waitpid(sleeper, &status, WNOHANG) == sleeper) ::_exit(WIFSIGNALED(status) ? WTERMSIG(status) : 102);
      std::this_thread::sleep_for(10ms);
    }
    ::kill(sleeper, SIGKILL);
    ::_exit(0);
  }
  int status = 0;
  if (::waitpid(judge, &status, 0) != judge || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// A child spawned with dies_with_parent is killed when its parent dies (the launcher's workers, when the launcher is
// SIGKILLed: else they live on and hang on their peers); without it, it lives on.
TEST(ProcessGroup, AChildThatDiesWithItsParentIsKilledWhenTheParentIsAndNoOtherIs) {
  EXPECT_EQ(fate_of_an_orphan(true), SIGKILL) << "100+: the judge failed; 0: the child outlived its parent";
  EXPECT_EQ(fate_of_an_orphan(false), 0) << "a child without dies_with_parent must outlive its parent";
}

TEST(ProcessGroup, LeavesNothingBehindWhenDestroyedAndTerminateEscalates) {
  pid_t left = -1, stubborn = -1;
  {
    ProcessGroup g;
    left = g.member(g.spawn({"sleeper", {"/bin/sleep", "60"}, {}, ""})).pid;
    EXPECT_FALSE(g.wait_all(50ms));
  }
  EXPECT_FALSE(running(left)) << "the group's destructor kills and reaps what still runs";

  const std::string ready = "/tmp/commsched-pg-test-ready-" + std::to_string(::getpid());
  ProcessGroup g;
  stubborn = g.member(g.spawn({"ignores TERM", {"/bin/sh", "-c", "trap '' TERM; touch " + ready + "; sleep 60"}, {}, ""})).pid;
  for (int i = 0; i < 2000 && ::access(ready.c_str(), F_OK) != 0; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(::access(ready.c_str(), F_OK), 0) << "the shell never installed its trap";
  std::remove(ready.c_str());
  g.terminate(SIGTERM, 300ms);
  EXPECT_EQ(g.alive(), 0);
  EXPECT_EQ(g.members()[0].signal, SIGKILL) << "SIGTERM was ignored, so the grace ran out and SIGKILL followed";
  EXPECT_FALSE(running(stubborn));
}

// Once every member has exited and been reaped, the group is gone: a later child leads a new one, which the group's
// signals reach (an elastic launch starting a worker again after all the others had exited).
TEST(ProcessGroup, AChildStartedAfterEveryMemberExitedLeadsANewGroup) {
  ProcessGroup g;
  g.spawn({"first", {"/bin/true"}, {}, ""});
  ASSERT_TRUE(g.wait_all(20s));
  const size_t late = g.spawn({"late", {"/bin/sleep", "30"}, {}, ""});
  const pid_t pid = g.members()[late].pid;
  for (int i = 0; i < 100 && ::getpgid(pid) != pid; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(::getpgid(pid), pid) << "the late child should lead a group of its own";
  g.terminate(SIGTERM, 5s);
  EXPECT_EQ(g.members()[late].signal, SIGTERM);
}

TEST(RankProcesses, EveryRankGetsTheContractOnOneFreshPort) {
  const TempDir dir;
  const std::string out = dir / "rank";
  RankProcesses ranks("/bin/sh",
                      {"-c", "echo $COMMSCHED_RANK/$COMMSCHED_NUM_WORKERS@$COMMSCHED_ROOT_ADDR:$COMMSCHED_ROOT_PORT > " + out +
                                 "$COMMSCHED_RANK; exit $COMMSCHED_RANK"},
                      3);
  const auto exits = ranks.wait(20s);
  ASSERT_EQ(exits.size(), 3u);
  std::string port;
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(exits[r].exited);
    EXPECT_EQ(exits[r].code, r);
    const std::string line = slurp(out + std::to_string(r));
    EXPECT_EQ(line.rfind(std::to_string(r) + "/3@127.0.0.1:", 0), 0u) << line;
    const std::string p = line.substr(line.find(':') + 1);
    if (r == 0) port = p;
    EXPECT_EQ(p, port) << "every rank meets at the same port";
  }
}

}  // namespace
}  // namespace commsched
