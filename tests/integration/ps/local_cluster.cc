#include "tests/integration/ps/local_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace commsched::testing {

// A free port below the kernel's ephemeral range (32768 and up by default): a port picked by bind(0) and closed again
// may be handed out by the kernel to the next bind(0) (another server's listener, seen in the UCX suite: server 1
// listened on the root's port before server 0 could bind it), while one below the range never is.
int free_tcp_port() {
  static std::mt19937 rng(std::random_device{}());
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = 20000 + static_cast<int>(rng() % 12000);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (free) return port;
  }
  throw std::runtime_error("no free loopback port in 20000-31999");
}

LocalCluster::LocalCluster(std::string exe, int workers, int servers, std::vector<std::string> worker_args,
                           std::map<std::string, std::string> extra_env)
    : exe_(std::move(exe)), workers_(workers), servers_(servers), worker_args_(std::move(worker_args)),
      env_(std::move(extra_env)) {
  char tmpl[] = "/tmp/commsched-ps-test-XXXXXX";
  if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  port_ = free_tcp_port();
}

LocalCluster::~LocalCluster() {
  if (pgid_ > 0) ::kill(-pgid_, SIGKILL);
  reap(true);
  std::system(("rm -rf '" + dir_ + "'").c_str());
}

pid_t LocalCluster::spawn(const std::string& role, int rank, const std::string& log,
                          const std::vector<std::string>& args) {
  std::map<std::string, std::string> env = env_;
  env["COMMSCHED_ROLE"] = role;
  env["COMMSCHED_RANK"] = std::to_string(rank);
  env["COMMSCHED_NUM_WORKERS"] = std::to_string(workers_);
  env["COMMSCHED_NUM_SERVERS"] = std::to_string(servers_);
  env["COMMSCHED_ROOT_ADDR"] = "127.0.0.1";
  env["COMMSCHED_ROOT_PORT"] = std::to_string(port_);
  env["COMMSCHED_BIND"] = "127.0.0.1";
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    setpgid(0, pgid_);  // 0 for the first child: it leads the group
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv{const_cast<char*>(exe_.c_str())};
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(exe_.c_str(), argv.data());
    _exit(127);
  }
  setpgid(pid, pgid_);  // also from the parent, so there is no window where a child has its own group
  if (pgid_ == 0) pgid_ = pid;
  return pid;
}

void LocalCluster::start() {
  for (int s = 0; s < servers_; ++s) {
    Proc p{"server " + std::to_string(s), -1, dir_ + "/server" + std::to_string(s) + ".log", {}, {}};
    p.pid = spawn("server", s, p.log, {});
    procs_.push_back(p);
  }
  for (int w = 0; w < workers_; ++w) {
    Proc p{"worker " + std::to_string(w), -1, dir_ + "/worker" + std::to_string(w) + ".log", {}, {}};
    std::vector<std::string> args = worker_args_;
    for (auto& a : args) {  // per-worker file names: {dir} is the cluster's directory, {rank} the worker's rank
      if (auto at = a.find("{dir}"); at != std::string::npos) a.replace(at, 5, dir_);
      if (auto at = a.find("{rank}"); at != std::string::npos) a.replace(at, 6, std::to_string(w));
    }
    p.pid = spawn("worker", w, p.log, args);
    procs_.push_back(p);
  }
}

void LocalCluster::reap(bool block) {
  for (auto& p : procs_) {
    if (p.exit_code || p.pid <= 0) continue;
    int status = 0;
    const pid_t r = waitpid(p.pid, &status, block ? 0 : WNOHANG);
    if (r == p.pid) {
      p.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      p.exited = std::chrono::steady_clock::now();
    }
  }
}

int LocalCluster::alive() {
  reap(false);
  int n = 0;
  for (auto& p : procs_) n += !p.exit_code;
  return n;
}

bool LocalCluster::wait_all(std::chrono::milliseconds timeout) {
  // Sanitizer builds (scripts/sanitize.sh) run several times slower: COMMSCHED_TEST_TIME_SCALE stretches how long a
  // whole run may take. Detection limits (a lost peer within 10 s) are not stretched.
  if (const char* k = std::getenv("COMMSCHED_TEST_TIME_SCALE"); k && std::atof(k) > 1)
    timeout = std::chrono::milliseconds(static_cast<int64_t>(static_cast<double>(timeout.count()) * std::atof(k)));
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (alive() > 0) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

Proc& LocalCluster::proc(const std::string& name) {
  for (auto& p : procs_)
    if (p.name == name) return p;
  throw std::out_of_range("no process " + name);
}

void LocalCluster::kill9(const std::string& name) { ::kill(proc(name).pid, SIGKILL); }

std::string LocalCluster::read_log(const std::string& name) const {
  for (auto& p : procs_)
    if (p.name == name) {
      std::ifstream f(p.log);
      std::stringstream ss;
      ss << f.rdbuf();
      return ss.str();
    }
  return {};
}

}  // namespace commsched::testing
