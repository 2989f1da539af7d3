#include "comm_backends/ps/server.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <thread>

#include "comm_backends/cluster_auth.h"
#include "comm_backends/ps/messaging.h"
#include "comm_backends/ps/net_util.h"

namespace commsched {
namespace ps {
namespace {
using std::chrono::duration;
using std::chrono::duration_cast;
using std::chrono::milliseconds;

std::string port_of(const std::string& endpoint) { return endpoint.substr(endpoint.rfind(':') + 1); }
}  // namespace

Server::Server(const ClusterEnv& env, const PsConfig& cfg, std::unique_ptr<Transport> transport)
    : env_(env),
      cfg_(cfg),
      transport_(std::move(transport)),
      pool_(BufferPool::create()),
      summer_(cfg.server_threads, cfg.parallel_sum_bytes),
      slots_(static_cast<uint32_t>(env.num_workers), cfg.deterministic, summer_, pool_),
      sharder_(std::max(1, env.num_servers)),
      live_(env.timeout_s),
      server_endpoints_(static_cast<size_t>(env.num_servers)),
      worker_peer_(static_cast<size_t>(env.num_workers), 0),
      lag_(env.num_workers),
      lag_warned_(static_cast<size_t>(env.num_workers)) {}

void Server::log(const std::string& line) const {
  std::ostringstream os;
  os << "[commsched server " << env_.rank << "] " << line << '\n';
  std::cerr << os.str() << std::flush;
}

Header Server::header(MsgType t) const {
  return make_header(t, PeerRole::server, static_cast<uint32_t>(env_.rank));
}

std::string Server::name_of(PeerId id) const {
  auto it = peers_.find(id);
  const std::string addr = transport_->describe(id);
  std::string n = it == peers_.end() ? "unregistered peer" : peer_name(it->second.role, it->second.rank);
  return addr.empty() ? n : n + " (" + addr + ")";
}

void Server::setup() {
  const std::string host = bind_host(env_);
  if (env_.rank == 0) {
    endpoint_ = transport_->bind(host, env_.root_port);
  } else {
    endpoint_ = "tcp://" + advertised_host(env_) + ":" + port_of(transport_->bind(host, 0));
    root_ = transport_->connect("tcp://" + env_.root_addr + ":" + std::to_string(env_.root_port));
    peers_[root_] = Peer{PeerRole::server, 0};
    live_.watch(root_);  // silence counts once it has spoken
    send_text(*transport_, root_, header(MsgType::hello), endpoint_);
  }
  log("listening on " + endpoint_ + "; " + env_.describe() + (authentication_.empty() ? "" : "; authenticated (" + authentication_ + ")") +
      (cfg_.deterministic ? "; deterministic sums" : "") +
      (cfg_.emulate_rate_bps > 0 ? "; EMULATED link rate " + std::to_string(cfg_.emulate_rate_bps / 1e9) + " Gbit/s"
                                 : ""));
}

int Server::run() {
  setup();
  const auto start = Clock::now();
  const auto hb = duration_cast<milliseconds>(duration<double>(cfg_.heartbeat_s));
  next_tick_ = start + hb;
  while (!failed_) {
    auto now = Clock::now();
    const auto wait = next_tick_ > now ? duration_cast<milliseconds>(next_tick_ - now) : milliseconds(0);
    if (auto in = transport_->receive(live_.poll_wait(wait, now))) handle(*in);
    if (failed_) break;
    if (auto loss = live_.check(Clock::now())) lose(name_of(loss->peer) + " lost: " + loss->why, loss->peer);
    if (failed_) break;
    now = Clock::now();
    if (now >= next_tick_) {
      tick();
      next_tick_ = now + hb;
    }
    if (!rendezvous_done_ && now - start > duration<double>(cfg_.rendezvous_timeout_s))
      lose("rendezvous timed out after " + std::to_string(cfg_.rendezvous_timeout_s) + " s waiting for peers", 0);
    if (all_workers_left()) {
      for (auto& [id, p] : peers_)
        if (p.role == PeerRole::server && !live_.left(id)) send_msg(*transport_, id, header(MsgType::bye));
      transport_->close(true);
      log("every worker has left; exiting");
      return 0;
    }
  }
  transport_->close(true);
  return 1;
}

void Server::handle(Incoming& in) {
  if (in.kind == Incoming::Kind::dropped) {
    if (in.peer != 0 && in.peer == root_) return lose(in.detail, in.peer);  // the root refused our handshake
    log(in.detail);
    return;
  }
  if (dropped_.count(in.peer)) return;
  if (in.kind == Incoming::Kind::disconnected) return live_.closed(in.peer, Clock::now());
  std::optional<uint64_t> psize;
  if (in.payload) psize = in.payload->bytes().size();
  Decoded d = decode_header(in.header, psize, DecodeLimits{cfg_.max_message_bytes});
  if (!d.header) return drop_peer(in.peer, d.error);
  if (in.extra_frames) return drop_peer(in.peer, std::to_string(in.extra_frames) + " unexpected extra frame(s)");
  on_message(in.peer, *d.header, std::move(in.payload));
}

Server::Peer* Server::register_peer(PeerId id, const Header& h) {
  auto it = peers_.find(id);
  if (it != peers_.end()) {
    if (it->second.role != h.sender_role || it->second.rank != h.sender_rank) {
      drop_peer(id, "sender changed from " + peer_name(it->second.role, it->second.rank) + " to " +
                        peer_name(h.sender_role, h.sender_rank));
      return nullptr;
    }
    return &it->second;
  }
  if (h.type != MsgType::hello) {
    drop_peer(id, "first message is " + std::string(msg_type_name(h.type)) + ", not hello");
    return nullptr;
  }
  live_.watch(id, Clock::now());
  return &peers_.emplace(id, Peer{h.sender_role, h.sender_rank}).first->second;
}

void Server::on_message(PeerId id, const Header& h, std::unique_ptr<Payload> payload) {
  const bool fresh = !peers_.count(id);
  Peer* p = register_peer(id, h);
  if (!p) return;
  const auto now = Clock::now();
  live_.heard(id, now);
  switch (h.type) {
    case MsgType::hello:
      if (fresh) on_hello(id, h, payload_text(payload.get()));
      else if (id != root_) drop_peer(id, "said hello twice");
      return;
    case MsgType::ping: return;
    case MsgType::bye: live_.said_bye(id); return;
    case MsgType::peer_lost:
      return lose(payload_text(payload.get()) + " (reported by " + peer_name(p->role, p->rank) + ")", id);
    case MsgType::assign_req:
      if (env_.rank == 0 && p->role == PeerRole::worker) return on_assign(id, h);
      break;
    case MsgType::join:
      if (p->role == PeerRole::worker && rendezvous_done_) return on_join(p->rank);
      break;
    case MsgType::push_pull:
    case MsgType::bcast:
      if (p->role == PeerRole::worker) {
        lag_.pushed(p->rank, h.iteration, now);
        return on_data(id, h, std::move(payload));
      }
      break;
    default: break;
  }
  drop_peer(id, "unexpected " + std::string(msg_type_name(h.type)) + " message");
}

void Server::on_hello(PeerId id, const Header& h, const std::string& text) {
  const bool worker = h.sender_role == PeerRole::worker;
  const int limit = worker ? env_.num_workers : env_.num_servers;
  std::string why;
  if (h.sender_role == PeerRole::tool) why = "tools may not join";
  else if (h.sender_rank >= static_cast<uint32_t>(limit)) why = "rank out of range (" + std::to_string(limit) + ")";
  else if (!worker && (env_.rank != 0 || h.sender_rank == 0 || text.rfind("tcp://", 0) != 0))
    why = "unexpected server hello (endpoint '" + text + "')";
  else if (worker && worker_peer_[h.sender_rank] != 0) why = "this worker rank is already connected";
  else if (!worker && !server_endpoints_[h.sender_rank].empty()) why = "this server rank is already connected";
  if (!why.empty()) {
    peers_.erase(id);  // not a member: a foreign or confused process
    live_.forget(id);
    return drop_peer(id, "hello from " + peer_name(h.sender_role, h.sender_rank) + " refused: " + why);
  }
  if (worker) worker_peer_[h.sender_rank] = id;
  else server_endpoints_[h.sender_rank] = text;
  maybe_finish_rendezvous();
}

void Server::maybe_finish_rendezvous() {
  if (rendezvous_done_) return;
  for (PeerId w : worker_peer_)
    if (w == 0) return;
  if (env_.rank == 0)
    for (int s = 1; s < env_.num_servers; ++s)
      if (server_endpoints_[static_cast<size_t>(s)].empty()) return;
  rendezvous_done_ = true;
  if (env_.rank == 0) {
    std::string list;
    for (int s = 1; s < env_.num_servers; ++s) list += server_endpoints_[static_cast<size_t>(s)] + "\n";
    Header h = header(MsgType::peers);
    h.aux = static_cast<uint32_t>(env_.num_servers);
    for (PeerId w : worker_peer_) send_text(*transport_, w, h, list);
  }
  log("rendezvous complete: " + std::to_string(env_.num_workers) + " workers");
}

void Server::on_assign(PeerId id, const Header& h) {
  Header r = header(MsgType::assign_rep);
  r.key = h.key;
  r.offset = h.offset;
  r.request_id = h.request_id;
  r.aux = static_cast<uint32_t>(sharder_.assign(h.key, h.offset, h.length));
  send_msg(*transport_, id, r);
}

void Server::on_data(PeerId id, const Header& h, std::unique_ptr<Payload> payload) {
  if (h.flags & kFlagAckReceipt) {  // the worker's credit waits for this, not for the other workers' pushes
    Header r = header(MsgType::received);
    r.key = h.key;
    r.offset = h.offset;
    r.request_id = h.request_id;
    send_msg(*transport_, id, r);
  }
  outcomes_.clear();
  slots_.push(h, id, std::move(payload), outcomes_);
  for (Outcome& o : outcomes_) send_outcome(o);
  outcomes_.clear();
}

// The worker stands in with zeros from now on; once every worker has joined, each hears `joined` (naming the last)
// and every slot waits for every worker again.
void Server::on_join(uint32_t worker) {
  outcomes_.clear();
  if (!slots_.join(worker, outcomes_)) return;  // said twice
  lag_.forget(worker);
  for (Outcome& o : outcomes_) send_outcome(o);
  outcomes_.clear();
  if (!slots_.all_joined()) return;
  slots_.end_joins();
  Header h = header(MsgType::joined);
  h.aux = worker;
  for (PeerId w : worker_peer_) send_msg(*transport_, w, h);
  log("every worker has joined (worker " + std::to_string(worker) + " last)");
}

void Server::send_outcome(Outcome& o) {
  if (!o.error.empty()) log("answering " + std::to_string(o.waiters.size()) + " worker(s) with an error: " + o.error);
  for (const Waiter& w : o.waiters) {
    Header h = o.reply;
    h.sender_role = PeerRole::server;
    h.sender_rank = static_cast<uint32_t>(env_.rank);
    h.request_id = w.request_id;
    if (!o.error.empty()) {
      send_text(*transport_, w.peer, h, o.error);
    } else if (w.gets_data) {
      send_msg(*transport_, w.peer, h, OutPayload{o.data.get(), h.length, [keep = o.data] {}});
    } else {
      send_msg(*transport_, w.peer, h);
    }
  }
}

void Server::drop_peer(PeerId id, const std::string& why) {
  auto it = peers_.find(id);
  if (it != peers_.end()) return lose(name_of(id) + " sent a malformed message: " + why, id);
  log("dropping connection from " + name_of(id) + ": " + why + "; still serving the others");
  Header h = header(MsgType::error);
  send_text(*transport_, id, h, "connection dropped by server " + std::to_string(env_.rank) + ": " + why);
  dropped_.insert(id);
}

void Server::tick() {
  // Pings also probe: an unroutable peer is reported as gone.
  for (PeerId id : live_.expected()) send_msg(*transport_, id, header(MsgType::ping));
  warn_laggards(Clock::now());
}

void Server::warn_laggards(Clock::time_point now) {
  for (const LagTracker::Lag& l : lag_.laggards(now, kLagWarningS)) {
    auto& warned = lag_warned_[l.worker];
    if (warned != Clock::time_point{} && now - warned < kLagRepeat) continue;
    warned = now;
    std::ostringstream os;
    os.precision(2);
    os << std::fixed << "warning: " << name_of(worker_peer_[l.worker]) << " is slow but alive: "
       << (l.lead - l.iteration) << " iteration(s) behind (at " << l.iteration << ", others at " << l.lead
       << "); the others reached iteration " << l.iteration + 1 << " " << l.seconds << " s ago and wait for it";
    log(os.str());
  }
}

void Server::lose(const std::string& what, PeerId except) {
  if (failed_) return;
  failed_ = true;
  failure_ = what;
  log("error: " + what + "; stopping");
  if (failure_hook_) failure_hook_();
  for (PeerId id : live_.expected())
    if (id != except) send_text(*transport_, id, header(MsgType::peer_lost), what);
}

bool Server::all_workers_left() const {
  if (!rendezvous_done_) return false;
  for (PeerId w : worker_peer_) {
    if (!live_.left(w)) return false;
  }
  return true;
}

}  // namespace ps

int run_server(const ClusterEnv& env, const PsConfig& cfg, bool owns_process) {
  env.validate();
  cfg.validate(env.timeout_s);
  if (env.role != Role::server) throw InvalidArgument("run_server needs COMMSCHED_ROLE=server");
  if (env.num_servers < 1) throw InvalidArgument("COMMSCHED_NUM_SERVERS must be at least 1 for a server");
  ps::TransportOptions opts;
  opts.emulate_rate_bps = cfg.emulate_rate_bps;
  opts.max_message_bytes = cfg.max_message_bytes + 4096;
  opts.io_threads = cfg.io_threads;
  opts.auth_secret = ClusterAuth::from_env().secret_for(ps::bind_host(env));
  ps::Server server(env, cfg, ps::make_transport(cfg.transport, opts));
  if (!opts.auth_secret.empty())
    server.set_authentication(cfg.transport == "ucx" ? "shared-secret HMAC handshake; UCX data not encrypted"
                                                     : "CURVE; encrypted");
  if (owns_process)
    server.on_failure([rank = env.rank] {
      std::thread([rank] {
        std::this_thread::sleep_for(std::chrono::seconds(5));
        std::fprintf(stderr, "[commsched server %d] shutdown after the failure did not finish within 5 s; exiting\n", rank);
        std::fflush(stderr);
        std::_Exit(1);
      }).detach();
    });
  return server.run();
}

}  // namespace commsched
