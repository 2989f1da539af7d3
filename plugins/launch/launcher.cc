#include "plugins/launch/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>

#include "comm_backends/cluster_auth.h"
#include "comm_backends/cluster_env.h"
#include "comm_backends/control/socket.h"
#include "comm_backends/ps/transport.h"
#include "plugins/launch/elastic_store.h"
#include "plugins/launch/node_link.h"
#include "plugins/launch/process_group.h"
#include "plugins/launch/run_keys.h"
#include "base/types.h"

namespace commsched {
namespace {

struct Child {
  size_t member = 0;  // index in the process group
  bool worker = false;
  int local = 0;       // this node's worker (or server) index
  std::string id;      // elastic: COMMSCHED_ELASTIC_ID
};

void say(const std::string& line) { std::fprintf(stderr, "[commsched launch] %s\n", line.c_str()); }

// A one-host cluster: UCX shared memory when UCX is built in (authenticated by the run's secret like ZeroMQ), unless
// the caller chose a transport (COMMSCHED_PS_TRANSPORT); a UCX_TLS the caller set is kept. ZeroMQ with CURVE
// otherwise, and across nodes (where the wire may be snooped, CURVE also encrypts).
std::map<std::string, std::string> transport_env() {
  if (!ps::ucx_built_in() || std::getenv("COMMSCHED_PS_TRANSPORT")) return {};
  std::map<std::string, std::string> env = {{"COMMSCHED_PS_TRANSPORT", "ucx"}};
  if (!std::getenv("UCX_TLS")) env["UCX_TLS"] = "sm,self";
  return env;
}

std::string transport_note(bool one_host) {
  const char* t = std::getenv("COMMSCHED_PS_TRANSPORT");
  const auto env = one_host ? transport_env() : std::map<std::string, std::string>{};
  const std::string kind = t ? t : (env.empty() ? "zmq" : "ucx");
  const char* tls = std::getenv("UCX_TLS");
  if (kind != "ucx") return "PS transport " + kind;
  return "PS transport ucx (UCX_TLS=" + (tls ? std::string(tls) : env.count("UCX_TLS") ? env.at("UCX_TLS") : "") + ")";
}

class Cluster {
 public:
  explicit Cluster(const LaunchOptions& o) : o_(o) {}

  int run() {
    sigset_t mask;
    sigemptyset(&mask);
    for (int s : {SIGINT, SIGTERM, SIGCHLD}) sigaddset(&mask, s);
    sigprocmask(SIG_BLOCK, &mask, &old_mask_);  // handled synchronously with sigtimedwait below
    // Where ssh is gone, sshd has closed our stderr with our stdin: a message must fail with EPIPE, not kill us by
    // SIGPIPE before we stop the workers (and their children). The children get old_mask_, SIGPIPE unblocked.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigprocmask(SIG_BLOCK, &pipe, nullptr);
    if (o_.stdin_lifeline) take_stdin();
    env_ = o_.extra_env;
    if (o_.nnodes > 1) {
      auto [host, port] = parse_host_port(o_.root);
      root_host_ = host;
      port_ = port + 1;
      if (o_.min_workers > 0 && o_.node_rank == 0) start_elastic();  // its address goes to every node with GO
      say("node " + std::to_string(o_.node_rank) + " of " + std::to_string(o_.nnodes) + ": joining at " + o_.root);
      // The rendezvous store's rule: a root beyond loopback needs the run's secret; on loopback it is used if set.
      link_ = NodeLink::join(o_.nnodes, o_.node_rank, {o_.workers, o_.servers}, host, port, env_,
                             o_.join_timeout_s, ClusterAuth::from_env().secret_for(host), peer_timeout_s());
      number_from_shares();
    } else {
      port_ = free_loopback_port();
      // One fresh secret per run: no process outside it can join. A multi-node run shares its secret through
      // COMMSCHED_SECRET / COMMSCHED_KEY_FILE on every node; it is never sent over the node link
      // (authenticated with it, not encrypted).
      const std::map<std::string, std::string> auth = run_auth_env();
      env_.insert(auth.begin(), auth.end());
    }
    if (o_.min_workers > 0 && !link_) start_elastic();
    if (link_) follow_node0_elastic();
    for (int s = 0; s < o_.servers; ++s) spawn("server", s);
    for (int w = 0; w < o_.workers; ++w) spawn("worker", w);
    for (int j = 0; j < o_.join_workers; ++j) spawn("worker", o_.workers - 1, /*joiner=*/true);
    say("started " + std::to_string(o_.servers) + " server(s) and " + std::to_string(o_.workers) + " worker(s)" +
        (link_ ? " on node " + std::to_string(o_.node_rank) + " (worker ranks " + std::to_string(first_worker_) +
                     ".." + std::to_string(first_worker_ + o_.workers - 1) + " of " + std::to_string(num_workers_) +
                     ")"
               : std::string()) +
        ", rendezvous " + root_host_ + ":" +
        std::to_string(port_) + "; " + transport_note(o_.nnodes <= 1));
    const int rc = supervise(mask);
    // SIGPIPE stays blocked: a message that failed with EPIPE left it pending, and unblocking it would kill us now.
    sigset_t after = old_mask_;
    sigaddset(&after, SIGPIPE);
    sigprocmask(SIG_SETMASK, &after, nullptr);
    return rc;
  }

 private:
  // Elastic: the membership store, and what every worker must know of it.
  // Across nodes node 0 serves it where the others reach it (the root's host), and its settings are node 0's.
  void start_elastic() {
    auto own = env_.find("COMMSCHED_SECRET");
    const std::string secret = own != env_.end() ? own->second : ClusterAuth::from_env().secret_for(root_host_);
    const auto [bind, host] = ElasticStore::endpoint(root_host_, o_.bind);
    elastic_ = ElasticStore::serve(bind, host, secret, o_.nnodes, port_);
    restarts_left_ = o_.restarts;
    min_workers_ = o_.min_workers;
    env_["COMMSCHED_ELASTIC_STORE"] = elastic_->address();
    env_["COMMSCHED_MIN_WORKERS"] = std::to_string(o_.min_workers);
    env_["COMMSCHED_MAX_WORKERS"] = std::to_string(o_.max_workers);
  }

  // Another node of a multi-node run: elastic when node 0 is (its GO carried the store's address), which every node
  // must agree on; node 0 survives the loss of a whole node then.
  void follow_node0_elastic() {
    const auto store = env_.find("COMMSCHED_ELASTIC_STORE");
    const bool node0_elastic = store != env_.end();
    if (node0_elastic != (o_.min_workers > 0)) {  // every node stops, saying why (node 0 would count this one lost)
      const std::string why = std::string("node 0 runs ") +
                              (node0_elastic ? "elastic (--min-workers)" : "without --min-workers") + " but node " +
                              std::to_string(o_.node_rank) + (node0_elastic ? " without it" : " with it") +
                              ": give every node the same elastic settings";
      link_->abort(why);
      throw InvalidArgument("launch: " + why);
    }
    if (!node0_elastic) return;
    if (o_.node_rank == 0) {
      link_->survive_lost_nodes();
      return;
    }
    elastic_ = ElasticStore::connect(store->second, ClusterAuth::from_env().secret_for(root_host_), o_.nnodes);
    restarts_left_ = o_.restarts;
    min_workers_ = std::stoi(env_.at("COMMSCHED_MIN_WORKERS"));
  }

  // Across nodes: this node's ranks follow those of the nodes before it, each node with its own -w and -s.
  void number_from_shares() {
    const auto& shares = link_->shares();
    first_worker_ = first_server_ = num_workers_ = num_servers_ = 0;
    bool even = true;
    for (size_t n = 0; n < shares.size(); ++n) {
      if (static_cast<int>(n) < o_.node_rank) {
        first_worker_ += shares[n].workers;
        first_server_ += shares[n].servers;
      }
      num_workers_ += shares[n].workers;
      num_servers_ += shares[n].servers;
      even = even && shares[n].workers == shares[0].workers;
    }
    if (!even && num_servers_ > 0) refuse_uneven_ps(shares);
  }

  // A parameter-server run needs the same worker count on every node: each worker's automatic partition size
  // follows its host's share (the per-message cost where the workers fill the cores), and workers that cut a tensor
  // differently fail at the server; the hierarchical mode's lanes line up across machines too. All-reduce takes any.
  [[noreturn]] void refuse_uneven_ps(const std::vector<node_link::Share>& shares) {
    std::string counts;
    for (const auto& s : shares) counts += (counts.empty() ? "" : ",") + std::to_string(s.workers);
    const std::string why = "a parameter-server run (-s) needs the same number of workers on every node, but the "
                            "nodes run " + counts + " (-w): give every node the same -w, or run the all-reduce "
                            "(-s 0 on every node)";
    link_->abort(why);
    throw InvalidArgument("launch: " + why);
  }

  // The environment contract of this node's `local`-th worker or server.
  std::map<std::string, std::string> child_env(bool worker, int local) const {
    std::map<std::string, std::string> env = env_;
    const std::map<std::string, std::string> contract = {
        {"COMMSCHED_ROLE", worker ? "worker" : "server"},
        {"COMMSCHED_RANK", std::to_string((worker ? first_worker_ : first_server_) + local)},
        {"COMMSCHED_NUM_WORKERS", std::to_string(num_workers_)},
        {"COMMSCHED_NUM_SERVERS", std::to_string(num_servers_)},
        {"COMMSCHED_ROOT_ADDR", root_host_}, {"COMMSCHED_ROOT_PORT", std::to_string(port_)},
        {"COMMSCHED_LOCAL_RANK", std::to_string(worker ? local : 0)},
        {"COMMSCHED_LOCAL_SIZE", std::to_string(worker ? o_.workers : 1)}};
    for (const auto& [k, v] : contract) env[k] = v;
    const std::string bind = !o_.bind.empty() ? o_.bind : (link_ ? std::string() : std::string("127.0.0.1"));
    if (!bind.empty()) env["COMMSCHED_BIND"] = bind;
    if (o_.nnodes <= 1) env.merge(transport_env());
    if (!o_.emulate_rate.empty()) env["COMMSCHED_EMULATE_RATE"] = o_.emulate_rate;
    if (o_.deterministic) env["COMMSCHED_PS_DETERMINISTIC"] = "1";
    return env;
  }

  // joiner: an elastic worker started again, which waits for the survivors' next commit to join them.
  // overrides: contract variables of an elastic generation's servers.
  void spawn(const std::string& role, int local, bool joiner = false,
             const std::map<std::string, std::string>& overrides = {}) {
    const bool worker = role == "worker";
    std::vector<std::string> argv = worker ? o_.command : o_.server_args;
    const std::string exe = worker ? o_.command.front() : (o_.server_exe.empty() ? "/proc/self/exe" : o_.server_exe);
    if (!worker) argv.insert(argv.begin(), exe);
    std::map<std::string, std::string> env = child_env(worker, local);
    for (const auto& [k, v] : overrides) env[k] = v;
    const int rank = std::stoi(env.at("COMMSCHED_RANK"));
    std::string id;
    if (elastic_ && worker) {
      // Unique in the job: each node numbers its own.
      id = (link_ ? std::to_string(o_.node_rank) + "-" : std::string()) + std::to_string(next_elastic_id_++);
      env["COMMSCHED_ELASTIC_ID"] = id;
      if (joiner) env["COMMSCHED_ELASTIC_JOIN"] = "1";
    }
    if (!group_) group_.emplace(old_mask_, "commsched launch");  // children start with the caller's signal mask
    const std::string name = joiner ? "worker (joiner " + id + ")" : role + " " + std::to_string(rank);
    // Spawned from the launcher's main thread only (run() and supervise()), as dies_with_parent needs.
    const size_t at = group_->spawn(ProcessSpec{name, argv, env, "", /*dies_with_parent=*/true});
    children_.push_back(Child{at, worker, local, id});
    if (elastic_ && worker) elastic_->set_workers(o_.node_rank, running_ids());
  }

  // Reaps exited children; returns the first non-zero exit seen (if any) that ends the run.
  std::optional<std::pair<std::string, int>> reap() {
    std::optional<std::pair<std::string, int>> bad;
    for (size_t i : group_->reap()) {
      const ProcessState& m = group_->members()[i];
      if (*m.code != 0 && !absorbed(i) && !bad) bad = std::make_pair(m.name, *m.code);
    }
    return bad;
  }

  const Child* child_at(size_t member) const {
    for (const Child& c : children_)
      if (c.member == member) return &c;
    return nullptr;
  }

  std::vector<std::string> running_ids() const {
    std::vector<std::string> ids;
    for (const Child& c : children_)
      if (c.worker && !group_->members()[c.member].code) ids.push_back(c.id);
    return ids;
  }

  // Elastic: a failed worker the others can do without (marked lost for them; started again while restarts allow).
  // Below the minimum the workers are told to give up, and the run fails once they have (or after a grace).
  bool absorbed(size_t member) {
    const Child* c = child_at(member);
    if (!elastic_ || !c) return false;
    const ProcessState& m = group_->members()[member];
    if (!c->worker) {  // its workers re-form, and their next generation gets servers of its own
      say(m.name + " exited with status " + std::to_string(*m.code) + "; elastic: the next generation gets new servers");
      return true;
    }
    elastic_->mark_lost(c->id);
    elastic_->set_workers(o_.node_rank, running_ids());
    if (!elastic_failure_) elastic_failure_ = *m.code;
    if (restarts_left_ > 0) {
      --restarts_left_;
      say(m.name + here() + " exited with status " + std::to_string(*m.code) +
          "; elastic: starting it again as a joiner (" + std::to_string(restarts_left_) + " restart(s) left)");
      spawn("worker", c->local, /*joiner=*/true);
      return true;
    }
    judge_minimum(m.name + here() + " exited with status " + std::to_string(*m.code));
    return true;
  }

  // Elastic, node 0: a node whose launcher is lost took its workers with it (they die with their launcher).
  void node_lost(const LinkEvent& ev) {
    if (!elastic_failure_) elastic_failure_ = 1;
    elastic_->node_lost(ev.node);
    judge_minimum(ev.message);
  }

  // After a loss: below the minimum (every node's workers counted) the workers are told to give up, and the run
  // fails once they have (or after a grace).
  void judge_minimum(const std::string& what) {
    const int alive = elastic_->alive();
    say(what + "; elastic: " + std::to_string(alive) + " worker(s) remain (minimum " + std::to_string(min_workers_) +
        ")");
    if (alive < min_workers_ && !elastic_deadline_) {
      const std::string why = "fewer workers than the minimum remain (" + std::to_string(alive) + " < " +
                              std::to_string(min_workers_) + ", --min-workers)";
      elastic_->abort(why);
      say(why + "; stopping the run");
      elastic_deadline_ = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    }
  }

  // Elastic with servers: they keep nothing between rounds (the workers hold the model), so every generation gets
  // servers of its own, started here once the workers have published it, with its size and rendezvous root.
  void follow_generations() {
    if (!elastic_ || o_.servers == 0) return;
    const auto g = elastic_->latest();
    if (!g || g->number <= servers_generation_) return;
    servers_generation_ = g->number;
    const std::map<std::string, std::string> contract = {{"COMMSCHED_NUM_WORKERS", std::to_string(g->workers)},
                                                         {"COMMSCHED_ROOT_PORT", std::to_string(g->root_port)},
                                                         {"COMMSCHED_GENERATION", std::to_string(g->number)}};
    for (int s = 0; s < o_.servers; ++s) spawn("server", s, false, contract);
    say("elastic: generation " + std::to_string(g->number) + " of " + std::to_string(g->workers) +
        " worker(s): started its " + std::to_string(o_.servers) + " server(s)");
  }

  // The run's result once every process has exited: elastic, failures that were absorbed do not count, unless the
  // run was stopped below the minimum.
  int finished_code() const { return elastic_deadline_ ? (elastic_failure_ ? *elastic_failure_ : 1) : 0; }

  bool all_exited(bool workers_only) const {
    for (const Child& c : children_)
      if (!group_->members()[c.member].code && (c.worker || !workers_only)) return false;
    return true;
  }

  // COMMSCHED_TIMEOUT as the option registry reads it: a launcher silent that long is lost, as any peer is.
  static double peer_timeout_s() {
    ClusterEnv e;
    cluster_option_table().set_from_env(e);
    return e.timeout_s;
  }

  std::string here() const { return link_ ? " on node " + std::to_string(o_.node_rank) : std::string(); }

  int supervise(const sigset_t& mask) {
    using Clock = std::chrono::steady_clock;
    std::optional<Clock::time_point> servers_deadline;
    bool all_workers_done = !link_;  // one node: its workers are all the workers
    bool sent_workers_done = false, sent_done = false;
    for (;;) {
      timespec tick{0, link_ ? 20'000'000 : 100'000'000};
      const int sig = sigtimedwait(&mask, nullptr, &tick);
      if (sig == SIGINT || sig == SIGTERM) {
        say(std::string(sig == SIGINT ? "interrupted" : "terminated") + "; stopping the cluster");
        if (link_) link_->abort(sig == SIGINT ? "interrupted (Ctrl-C)" : "terminated");
        teardown(sig);
        return 130;
      }
      if (lifeline_.valid() && lifeline_closed()) {
        say("stdin closed (--stdin-lifeline: the launching side is gone or interrupted); stopping the cluster");
        if (link_) link_->abort("its launching side closed its stdin (interrupted, or ssh is gone)");
        teardown(SIGTERM);
        return 130;
      }
      while (link_) {
        auto ev = link_->poll(0);
        if (!ev) break;
        if (ev->kind == LinkEvent::Kind::abort) {
          say(ev->message + "; tearing down node " + std::to_string(o_.node_rank));
          teardown(SIGTERM);
          return 1;
        }
        if (ev->kind == LinkEvent::Kind::node_lost) node_lost(*ev);
        if (ev->kind == LinkEvent::Kind::all_workers_done) all_workers_done = true;
        if (ev->kind == LinkEvent::Kind::all_done) return finished_code();  // node 0: every node finished
      }
      follow_generations();
      if (auto bad = reap()) {
        say(bad->first + here() + " exited with status " + std::to_string(bad->second) + "; tearing down the cluster");
        if (link_) link_->abort(bad->first + " exited with status " + std::to_string(bad->second));
        teardown(SIGTERM);
        return bad->second;
      }
      if (link_ && all_exited(true) && !sent_workers_done) {
        sent_workers_done = true;
        link_->workers_done();
      }
      if (elastic_deadline_ && std::chrono::steady_clock::now() > *elastic_deadline_ && !all_exited(false)) {
        say("workers still running 20 s after the run was stopped below the minimum; tearing down");
        teardown(SIGTERM);
        return finished_code();
      }
      if (all_exited(false)) {
        if (!link_) return finished_code();
        if (!sent_done) {
          sent_done = true;
          link_->done();
        }
        if (o_.node_rank != 0) return finished_code();
        continue;  // node 0 serves the other launchers until every node has finished
      }
      // Workers done: servers leave on their own once every worker said goodbye; do not wait forever.
      if (all_exited(true) && all_workers_done) {
        if (!servers_deadline)
          servers_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.grace_s));
        if (Clock::now() > *servers_deadline) {
          say("servers did not exit after the workers finished; stopping them");
          teardown(SIGTERM);
          return 1;
        }
      }
    }
  }

  // --stdin-lifeline: the launcher keeps stdin to itself; its children get /dev/null there, as they had once the
  // remote shell had read its script (a worker reading stdin ends at once, instead of waiting on ssh's channel).
  void take_stdin() {
    struct stat st {};
    if (::isatty(0) || ::fstat(0, &st) != 0 || S_ISCHR(st.st_mode))
      throw InvalidArgument("launch --stdin-lifeline watches a pipe (what horovodrun gives a remote host over ssh); "
                            "stdin here is a terminal or a device such as /dev/null, whose end would stop the run at "
                            "once or on Ctrl-D");
    lifeline_.reset(::fcntl(0, F_DUPFD_CLOEXEC, 3));
    if (!lifeline_.valid()) throw std::runtime_error("launch --stdin-lifeline: no stdin to watch");
    const control::Fd null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (null.valid()) ::dup2(null.get(), 0);
  }

  // Whether the lifeline reached end-of-file (anything written to it is read and ignored).
  bool lifeline_closed() const {
    pollfd in{lifeline_.get(), POLLIN, 0};
    if (::poll(&in, 1, 0) <= 0) return false;
    char buf[256];
    const ssize_t n = ::read(lifeline_.get(), buf, sizeof buf);
    return n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN);
  }

  void teardown(int sig) {
    group_->terminate(sig, std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(o_.grace_s)));
  }

  LaunchOptions o_;
  std::map<std::string, std::string> env_;  // extra_env (on nodes other than 0: node 0's, as received)
  std::unique_ptr<NodeLink> link_;
  control::Fd lifeline_;  // --stdin-lifeline: the stdin the launcher was started with
  std::string root_host_ = "127.0.0.1";
  sigset_t old_mask_{};
  int port_ = 0;
  // This node's first worker and server rank, and the run's counts (one node: its own).
  int first_worker_ = 0, first_server_ = 0, num_workers_ = o_.workers, num_servers_ = o_.servers;
  std::optional<ProcessGroup> group_;  // created at the first spawn, once old_mask_ is known
  std::vector<Child> children_;
  std::unique_ptr<ElasticStore> elastic_;  // elastic runs only
  int next_elastic_id_ = 0;
  int restarts_left_ = 0;
  int min_workers_ = 0;                    // node 0's --min-workers
  int servers_generation_ = 0;             // the generation whose servers run
  std::optional<int> elastic_failure_;     // the first absorbed failure's code
  std::optional<std::chrono::steady_clock::time_point> elastic_deadline_;  // stopped below the minimum
};

}  // namespace

int launch_local_cluster(const LaunchOptions& opts) {
  if (opts.workers < 1) throw InvalidArgument("launch: --workers must be at least 1, got " + std::to_string(opts.workers));
  if (opts.servers < 0) throw InvalidArgument("launch: --servers must be at least 0, got " + std::to_string(opts.servers));
  if (opts.command.empty()) throw InvalidArgument("launch: no worker command given (use: launch -w 4 -s 2 -- cmd ...)");
  if (opts.nnodes < 1) throw InvalidArgument("launch: --nnodes must be at least 1, got " + std::to_string(opts.nnodes));
  if (opts.node_rank < 0 || opts.node_rank >= opts.nnodes)
    throw InvalidArgument("launch: --node-rank " + std::to_string(opts.node_rank) + " is not in [0, " +
                          std::to_string(opts.nnodes) + ")");
  if (opts.nnodes > 1 && opts.root.empty())
    throw InvalidArgument("launch: --nnodes " + std::to_string(opts.nnodes) + " needs --root HOST:PORT (node 0's "
                          "address and a free port, the same on every node)");
  // A generation's rendezvous root is its rank 0's host, where across nodes no server of that generation may run.
  if (opts.min_workers > 0 && opts.nnodes > 1 && opts.servers > 0)
    throw InvalidArgument("launch: elastic training across nodes (--min-workers with --nnodes " +
                          std::to_string(opts.nnodes) + ") runs on Gloo: use -s 0 (got -s " +
                          std::to_string(opts.servers) + ")");
  if ((opts.max_workers > 0 || opts.restarts > 0 || opts.join_workers > 0) && opts.min_workers == 0)
    throw InvalidArgument("launch: --max-workers, --restarts and --join-workers are elastic settings: set "
                          "--min-workers too");
  if (opts.max_workers > 0 && opts.min_workers > opts.max_workers)
    throw InvalidArgument("launch: --min-workers " + std::to_string(opts.min_workers) + " is above --max-workers " +
                          std::to_string(opts.max_workers));
  return Cluster(opts).run();
}

}  // namespace commsched
