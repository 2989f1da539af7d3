// `commsched horovodrun`'s pure parts: hosts and hostfiles as horovodrun reads them, workers placed as it places them
// (or refused where `commsched launch` cannot run the shares), and the command a remote host's shell runs, checked
// by running it in a real shell with characters a shell would otherwise read.
#include "plugins/launch/horovodrun.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/types.h"
#include "plugins/launch/process_group.h"

namespace commsched {
namespace {

using namespace std::chrono_literals;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Horovodrun, HostsAreReadAsHorovodrunReadsThem) {
  const auto h = parse_hosts("a:2,b,10.0.0.3:3");
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0].host, "a");
  EXPECT_EQ(h[0].slots, 2);
  EXPECT_EQ(h[1].slots, 1);
  EXPECT_EQ(h[2].host, "10.0.0.3");
  EXPECT_EQ(h[2].slots, 3);
  EXPECT_TRUE(has(error_of([] { parse_hosts("a:0"); }), "-H entry 'a:0'"));
  EXPECT_TRUE(has(error_of([] { parse_hosts("a:two"); }), "'two'"));
  EXPECT_TRUE(has(error_of([] { parse_hosts(":2"); }), "names no host"));
}

TEST(Horovodrun, AHostfileNamesTheLineItCannotRead) {
  const auto h = parse_hostfile("# the cluster\nnode1 slots=4\n\nnode2   slots = 2  # spare\nnode3\n", "hosts.txt");
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0].host, "node1");
  EXPECT_EQ(h[0].slots, 4);
  EXPECT_EQ(h[1].slots, 2);
  EXPECT_EQ(h[2].slots, 1);
  const std::string e = error_of([] { parse_hostfile("node1 slots=4\nnode2 cpus=2\n", "hosts.txt"); });
  EXPECT_TRUE(has(e, "hosts.txt line 2")) << e;
  EXPECT_TRUE(has(error_of([] { parse_hostfile("# nobody\n", "h"); }), "names no host"));
}

// As horovodrun places them: hosts in order, each up to its slots, until -np; hosts of different sizes keep theirs.
TEST(Horovodrun, WorkersFillTheHostsInOrderEachUpToItsSlots) {
  const auto shares = [](int np, const std::string& hosts) {
    std::string out;
    for (const HostSlots& h : place_workers(np, parse_hosts(hosts)))
      out += (out.empty() ? "" : ",") + h.host + ":" + std::to_string(h.slots);
    return out;
  };
  EXPECT_EQ(shares(4, "a:2,b:2,c:2"), "a:2,b:2");
  EXPECT_EQ(shares(2, "a:2,b:2,c:2"), "a:2");
  EXPECT_EQ(shares(3, "a:2,b:2,c:2"), "a:2,b:1");
  EXPECT_EQ(shares(6, "a:4,b:2"), "a:4,b:2");
  EXPECT_EQ(shares(5, "a:1,b:4,c:2"), "a:1,b:4");
  EXPECT_TRUE(has(error_of([] { place_workers(7, parse_hosts("a:2,b:2,c:2")); }),
                  "-np 7 is more than the hosts' 6 slot(s)"));
}

// A long value (module systems export variables of 100 KB) is quoted without a stack frame per character (std::regex
// overflowed the stack there).
TEST(Horovodrun, AValueOfAnySizeIsQuoted) {
  const std::string plain(300000, 'x'), spaced = std::string(300000, 'y') + " it's";
  EXPECT_EQ(shell_quote(plain), plain);
  EXPECT_EQ(shell_quote(spaced), "'" + std::string(300000, 'y') + " it'\\''s'");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("a-b_c/d:e=f,g@h%i+j.k"), "a-b_c/d:e=f,g@h%i+j.k");
}

TEST(Horovodrun, TheEnvironmentForwardedLeavesOutThisHostsOwnAndTheSecret) {
  const char* vars[] = {"PATH=/opt/bin", "HOSTNAME=here", "SSH_AUTH_SOCK=/tmp/a", "COMMSCHED_SECRET=hidden",
                        "PYTHONPATH=/p", "BASH_FUNC_f%%=() { :; }", "COMMSCHED_BACKEND=gloo", "PWD=/x", nullptr};
  const auto env = forwarded_env(const_cast<char**>(vars));
  const std::map<std::string, std::string> want = {
      {"COMMSCHED_BACKEND", "gloo"}, {"PATH", "/opt/bin"}, {"PYTHONPATH", "/p"}};
  EXPECT_EQ(env, want);
}

// What ssh runs on a remote host, run by /bin/sh as sshd would run it, with the script on its stdin (kept open, as
// horovodrun keeps ssh's: the shell runs the script without waiting for stdin's end): every word arrives unchanged,
// and the secret, the environment and the working directory are the caller's, though none of them is on the command
// line.
TEST(Horovodrun, TheRemoteScriptReachesTheProgramWordForWordAndNothingOfItIsOnTheCommandLine) {
  const auto base = std::filesystem::temp_directory_path() / ("hvdrun it's $here " + std::to_string(::getpid()));
  std::filesystem::create_directories(base);
  const std::string log = (base / "out").string();
  ProcessGroup g;
  ProcessSpec spec{"remote", {"/bin/sh", "-c", kRemoteShell}, {}, log, false, ""};
  spec.input = remote_script(
      base.string(),
      // A user's own `nl` (exported before the arguments, after X in sorted order) must not be their newline.
      {{"X", "it's $HOME `date` \"q\"\nline two"}, {"COMMSCHED_SECRET", "s3cret"}, {"W", "w"}, {"nl", "mine"}},
      {"/bin/sh", "-c", "printf '%s|' \"$PWD\" \"$X\" \"$COMMSCHED_SECRET\" \"$nl\" \"$@\"", "sh", "a b", "c'd", "$e",
       "x\ny"});
  spec.keep_input_open = true;
  EXPECT_EQ(std::count(spec.input.begin(), spec.input.end(), '\n'), 1) << "one line: " << spec.input;
  g.spawn(spec);
  ASSERT_TRUE(g.wait_all(20s)) << "the remote shell waited for its stdin to end";
  std::ifstream in(log);
  std::stringstream got;
  got << in.rdbuf();
  EXPECT_EQ(got.str(), base.string() + "|it's $HOME `date` \"q\"\nline two|s3cret|mine|a b|c'd|$e|x\ny|");
  EXPECT_FALSE(has(kRemoteShell, "s3cret") || has(kRemoteShell, "COMMSCHED"));
  std::filesystem::remove_all(base);
}

}  // namespace
}  // namespace commsched
