// The control plane alone, in one process over the ZeroMQ transport on loopback: rendezvous with two servers through
// the rendezvous store, protocol messages passed through, the goodbye barrier, a vanished or frozen node named to
// every survivor (and nobody else named), strangers dropped while the members are served, a server that never comes
// named by the workers.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm_backends/control/van.h"
#include "tests/unit/control/van_test_options.h"

using namespace std::chrono_literals;
using namespace commsched;
using namespace commsched::control;
using ps::MsgType;

namespace {

// One node: a transport, a Van over it and a protocol that records what reaches it, driven by its own thread.
class Node final : public VanProtocol {
 public:
  enum class Mode { serve, leave_when_ready, vanish_when_ready, freeze_when_ready, garble_when_ready };

  Node(VanOptions o, Mode mode, test_support::TestStore& store) : mode_(mode), store_(store.client()) {
    o.heartbeat_s = 0.05;
    o.log = [this](const std::string& line) { record(logs_, line); };
    transport_ = ps::make_zmq_transport({});
    van_ = std::make_unique<Van>(std::move(o), *transport_, *this, *store_);
  }
  ~Node() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (!closed_) transport_->close(false);
  }
  std::string start() {
    const std::string ep = van_->start();
    thread_ = std::thread([this] { loop(); });
    return ep;
  }

  void on_message(ps::PeerId, const Roster::Member& sender, const ps::Header& h,
                  std::unique_ptr<ps::Payload>) override {
    record(messages_, std::string(ps::msg_type_name(h.type)) + " from " + ps::peer_name(sender.role, sender.rank));
  }
  void on_ready() override {
    ready_ = true;
    if (van_->header(MsgType::ping).sender_role == PeerRole::worker)  // a protocol message to every server
      for (ps::PeerId s : van_->peers(PeerRole::server)) van_->send(s, van_->header(MsgType::join));
  }
  void on_failed(const Status& st) override {
    std::lock_guard lock(mu_);
    failure_ = st;
  }

  bool ready() const { return ready_; }
  bool exited() const { return exited_; }
  bool left_cleanly() const { return left_cleanly_; }
  std::optional<Status> failure() const {
    std::lock_guard lock(mu_);
    return failure_;
  }
  std::vector<std::string> messages() const {
    std::lock_guard lock(mu_);
    return messages_;
  }
  std::string logs() const {
    std::lock_guard lock(mu_);
    std::string s;
    for (const auto& l : logs_) s += l + "\n";
    return s;
  }

 private:
  void record(std::vector<std::string>& to, std::string line) {
    std::lock_guard lock(mu_);
    to.push_back(std::move(line));
  }
  void loop() {
    const bool server = van_->header(MsgType::ping).sender_role == PeerRole::server;
    while (!stop_) {
      if (ready_ && mode_ == Mode::vanish_when_ready) {  // a crash: no goodbye, the connections just end
        transport_->close(false);
        closed_ = true;
        break;
      }
      if (ready_ && mode_ == Mode::freeze_when_ready) {  // hung: connections open, nothing said
        std::this_thread::sleep_for(5ms);
        continue;
      }
      if (ready_ && mode_ == Mode::garble_when_ready) {  // a member whose next frame is not a header
        const char junk[ps::kHeaderBytes] = "not a commsched header";
        van_->transport().send(van_->peer(PeerRole::server, 0), std::as_bytes(std::span(junk)));
        mode_ = Mode::serve;
      }
      if (ready_ && mode_ == Mode::leave_when_ready) {
        van_->leave();
        closed_ = left_cleanly_ = true;
        break;
      }
      if (!van_->poll(10ms)) {
        closed_ = true;
        break;
      }
      if (server && van_->all_left(PeerRole::worker)) {  // the goodbye barrier
        van_->leave();
        closed_ = left_cleanly_ = true;
        break;
      }
    }
    exited_ = true;
  }

  Mode mode_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<ps::Transport> transport_;
  std::unique_ptr<Van> van_;
  std::thread thread_;
  std::atomic<bool> stop_{false}, ready_{false}, exited_{false}, closed_{false}, left_cleanly_{false};
  mutable std::mutex mu_;
  std::optional<Status> failure_;
  std::vector<std::string> messages_, logs_;
};

VanOptions options(PeerRole role, uint32_t rank, int workers, int servers) {
  return test_support::van_test_options(role, rank, workers, servers);
}

// A node that gives up on the rendezvous after half a second.
VanOptions impatient(PeerRole role, uint32_t rank, int workers, int servers) {
  VanOptions o = options(role, rank, workers, servers);
  o.rendezvous_timeout_s = 0.5;
  return o;
}

template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = 10s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

struct Cluster {
  test_support::TestStore store;
  std::unique_ptr<Node> root, server1;
  std::vector<std::unique_ptr<Node>> workers;
};

// Server 0 (root), server 1 and `modes.size()` workers, started in that order.
std::unique_ptr<Cluster> start_cluster(const std::vector<Node::Mode>& worker_modes, Node::Mode server1_mode = Node::Mode::serve) {
  const int w = static_cast<int>(worker_modes.size());
  auto owned = std::make_unique<Cluster>();  // the nodes hold clients of its store: it stays where it is
  Cluster& c = *owned;
  c.root = std::make_unique<Node>(options(PeerRole::server, 0, w, 2), Node::Mode::serve, c.store);
  c.root->start();
  c.server1 = std::make_unique<Node>(options(PeerRole::server, 1, w, 2), server1_mode, c.store);
  c.server1->start();
  for (int r = 0; r < w; ++r) {
    c.workers.push_back(
        std::make_unique<Node>(options(PeerRole::worker, static_cast<uint32_t>(r), w, 2), worker_modes[r], c.store));
    c.workers.back()->start();
  }
  return owned;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace

// Both workers find both servers in the rendezvous store, reach them with a protocol message, and leave;
// both servers pass the goodbye barrier and leave too, nobody failing.
TEST(Van, RendezvousPeerTablePassThroughAndGoodbye) {
  const auto cluster = start_cluster({Node::Mode::leave_when_ready, Node::Mode::leave_when_ready});
  Cluster& c = *cluster;
  const std::vector<Node*> nodes = {c.root.get(), c.server1.get(), c.workers[0].get(), c.workers[1].get()};
  // Every node, workers too: a server leaves once every worker has said goodbye, and a worker's leave() returns only
  // once both servers have answered, so the servers can be gone while a worker still waits for the second answer.
  ASSERT_TRUE(eventually([&] { return std::all_of(nodes.begin(), nodes.end(), [](Node* n) { return n->exited(); }); }))
      << c.root->logs();
  for (size_t i = 0; i < nodes.size(); ++i) {
    Node* n = nodes[i];
    EXPECT_TRUE(n->ready()) << "node " << i << " (servers 0, 1, then workers 0, 1)";
    EXPECT_TRUE(n->left_cleanly()) << "node " << i << " (servers 0, 1, then workers 0, 1)\n" << n->logs();
    EXPECT_FALSE(n->failure()) << n->failure()->message;
  }
  for (Node* s : {c.root.get(), c.server1.get()}) {
    EXPECT_TRUE(contains(s->messages(), "join from worker 0"));
    EXPECT_TRUE(contains(s->messages(), "join from worker 1"));
  }
}

// A worker that vanishes (no goodbye) is named by every survivor, directly or as reported, and nobody else is named
// lost (reporters are named as such).
TEST(Van, AVanishedWorkerIsNamedToEverySurvivor) {
  const auto cluster = start_cluster({Node::Mode::serve, Node::Mode::vanish_when_ready, Node::Mode::serve});
  Cluster& c = *cluster;
  const auto start = std::chrono::steady_clock::now();
  std::vector<Node*> survivors{c.root.get(), c.server1.get(), c.workers[0].get(), c.workers[2].get()};
  ASSERT_TRUE(eventually([&] {
    for (Node* n : survivors)
      if (!n->failure()) return false;
    return true;
  })) << c.root->logs();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  for (Node* n : survivors) {
    const Status st = *n->failure();
    EXPECT_EQ(st.code, Status::Code::peer_lost) << st.message;
    // "worker 1 (addr) lost: ...", perhaps followed by who reported it: the lost one is named first, and only it.
    EXPECT_EQ(st.message.rfind("worker 1 ", 0), 0u) << st.message;
    EXPECT_EQ(st.message.find(" lost"), st.message.find(" lost: ")) << st.message;
    EXPECT_EQ(st.message.find(" lost: "), st.message.rfind(" lost: ")) << st.message;
  }
  // The workers heard it from a server.
  EXPECT_NE(c.workers[0]->failure()->message.find("(reported by server"), std::string::npos);
}

// A frozen server 1 (connections open, silent) is found by the silence limit and named by everybody.
TEST(Van, AFrozenServerIsFoundBySilenceAndNamed) {
  const auto cluster = start_cluster({Node::Mode::serve, Node::Mode::serve}, Node::Mode::freeze_when_ready);
  Cluster& c = *cluster;
  std::vector<Node*> survivors{c.root.get(), c.workers[0].get(), c.workers[1].get()};
  ASSERT_TRUE(eventually([&] {
    for (Node* n : survivors)
      if (!n->failure()) return false;
    return true;
  }));
  for (Node* n : survivors) {
    const Status st = *n->failure();
    EXPECT_EQ(st.code, Status::Code::peer_lost) << st.message;
    EXPECT_NE(st.message.find("server 1"), std::string::npos) << st.message;
  }
  const std::string direct = c.root->failure()->message + c.workers[0]->failure()->message;
  EXPECT_NE(direct.find("no message for 2 s"), std::string::npos) << direct;
}

// Strangers on the root's port (a hello for a rank out of range, a message before any hello) get an error and are
// ignored; the real members complete the rendezvous.
TEST(Van, StrangersAreDroppedAndTheMembersServed) {
  test_support::TestStore store;
  Node root(options(PeerRole::server, 0, 1, 1), Node::Mode::serve, store);
  const std::string ep = root.start();
  auto stranger = ps::make_zmq_transport({});
  std::array<std::byte, ps::kHeaderBytes> hello, ping;
  ps::encode_header(ps::make_header(MsgType::hello, PeerRole::worker, 5), hello);
  ps::encode_header(ps::make_header(MsgType::ping, PeerRole::worker, 0), ping);
  const ps::PeerId a = stranger->connect(ep), b = stranger->connect(ep);
  stranger->send(a, hello);
  stranger->send(b, ping);
  int errors = 0;
  const auto end = std::chrono::steady_clock::now() + 5s;
  while (errors < 2 && std::chrono::steady_clock::now() < end)
    if (auto in = stranger->receive(10ms); in && in->kind == ps::Incoming::Kind::message) ++errors;
  EXPECT_EQ(errors, 2) << "every stranger gets an error reply\n" << root.logs();
  Node worker(options(PeerRole::worker, 0, 1, 1), Node::Mode::leave_when_ready, store);
  worker.start();
  ASSERT_TRUE(eventually([&] { return root.exited(); })) << root.logs();
  EXPECT_TRUE(root.left_cleanly());
  const std::string logs = root.logs();
  EXPECT_NE(logs.find("hello from worker 5 refused: rank 5 is out of range [0, 1)"), std::string::npos) << logs;
  EXPECT_NE(logs.find("first message is ping, not hello"), std::string::npos) << logs;
  EXPECT_NE(logs.find("still serving the others"), std::string::npos) << logs;
  stranger->close(false);
}

// A member that sends a malformed frame stops the cluster, named as the culprit by every survivor.
TEST(Van, AMemberSendingGarbageIsNamedAndStopsTheCluster) {
  const auto cluster = start_cluster({Node::Mode::serve, Node::Mode::garble_when_ready});
  Cluster& c = *cluster;
  std::vector<Node*> survivors{c.root.get(), c.server1.get(), c.workers[0].get()};
  ASSERT_TRUE(eventually([&] {
    for (Node* n : survivors)
      if (!n->failure()) return false;
    return true;
  })) << c.root->logs();
  EXPECT_NE(c.root->failure()->message.find("worker 1"), std::string::npos) << c.root->failure()->message;
  EXPECT_NE(c.root->failure()->message.find("sent a malformed message: bad magic"), std::string::npos)
      << c.root->failure()->message;
  for (Node* n : {c.server1.get(), c.workers[0].get()})
    EXPECT_NE(n->failure()->message.find("worker 1"), std::string::npos) << n->failure()->message;
}

// A rank that never comes: the root gives up after the rendezvous timeout naming it, and tells those who came.
TEST(Van, ARendezvousTimeoutNamesWhoIsMissing) {
  test_support::TestStore store;
  Node root(impatient(PeerRole::server, 0, 2, 1), Node::Mode::serve, store);
  root.start();
  Node worker(options(PeerRole::worker, 0, 2, 1), Node::Mode::serve, store);
  worker.start();
  ASSERT_TRUE(eventually([&] { return root.failure() && worker.failure(); }));
  EXPECT_NE(root.failure()->message.find("rendezvous timed out after 0.5"), std::string::npos) << root.failure()->message;
  EXPECT_NE(root.failure()->message.find("waiting for worker 1"), std::string::npos) << root.failure()->message;
  EXPECT_NE(worker.failure()->message.find("waiting for worker 1"), std::string::npos) << worker.failure()->message;
}

// A server that never comes: the workers give up after the rendezvous timeout naming it and the store key they
// waited for (no hang, nothing dialed), and the root names it too.
TEST(Van, AServerThatNeverComesIsNamedByTheWorkers) {
  test_support::TestStore store;
  Node root(impatient(PeerRole::server, 0, 1, 3), Node::Mode::serve, store);
  root.start();
  Node worker(impatient(PeerRole::worker, 0, 1, 3), Node::Mode::serve, store);
  const auto t0 = std::chrono::steady_clock::now();
  worker.start();
  ASSERT_TRUE(eventually([&] { return root.failure() && worker.failure(); }));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  const std::string said = worker.failure()->message;
  EXPECT_NE(said.find("rendezvous timed out after 0.5 s waiting for server 1 to publish its endpoint"),
            std::string::npos) << said;
  EXPECT_NE(said.find("'ps/server/1' in the rendezvous store at 127.0.0.1:"), std::string::npos) << said;
  EXPECT_FALSE(worker.ready());
  EXPECT_NE(root.failure()->message.find("server 1, server 2"), std::string::npos)
      << root.failure()->message;
}
