#include "comm_backends/ps/server.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <sstream>
#include <thread>

#include "base/cpu_usage.h"
#include "comm_backends/collective/kv_store.h"
#include "comm_backends/straggler.h"

namespace commsched {
namespace ps {
namespace {
using std::chrono::duration;
using std::chrono::duration_cast;
using std::chrono::milliseconds;

control::VanOptions van_options(const ClusterEnv& env, const PsConfig& cfg, const collective::Rendezvous& rendezvous,
                                std::function<void(const std::string&)> log) {
  control::VanOptions o = cfg.van_options(env, rendezvous);
  o.log = std::move(log);
  return o;
}

SumEngine::Options engine_options(const ClusterEnv& env, const PsConfig& cfg) {
  SumEngine::Options o;
  o.shards = cfg.server_threads > 0 ? cfg.server_threads : static_cast<int>(usable_cores());
  o.num_workers = static_cast<uint32_t>(env.num_workers);
  o.deterministic = cfg.deterministic;
  o.staleness = cfg.staleness_bound();
  return o;
}
}  // namespace

Server::Server(const ClusterEnv& env, const PsConfig& cfg, std::unique_ptr<Transport> transport)
    : env_(env),
      cfg_(cfg),
      transport_(std::move(transport)),
      rendezvous_(cfg.rendezvous(env)),
      van_(van_options(env, cfg, *rendezvous_, [this](const std::string& line) { log(line); }), *transport_,
           *this, rendezvous_->store()),
      pool_(BufferPool::create()),
      summer_(cfg.server_threads, cfg.parallel_sum_bytes),
      engine_(engine_options(env, cfg), summer_, pool_, [this] { transport_->wake(); }),
      replies_(van_, static_cast<uint64_t>(cfg.reply_bound), [t = transport_.get()] { t->wake(); }),
      sharder_(std::max(1, env.num_servers)),
      lag_(env.num_workers),
      lag_warned_(static_cast<size_t>(env.num_workers)),
      stall_watch_(cfg.stall) {}

void Server::log(const std::string& line) const {
  std::ostringstream os;
  os << "[commsched server " << env_.rank << "] " << line << '\n';
  std::cerr << os.str() << std::flush;
}

int Server::run() {
  const std::string endpoint = van_.start();
  if (!van_.failed())  // else on_failed has said why
    log("listening on " + endpoint + "; " + env_.describe() +
        (authentication_.empty() ? "" : "; authenticated (" + authentication_ + ")") +
        (cfg_.deterministic ? "; deterministic sums" : "") +
        (cfg_.mode == "sync" ? "" : "; gradients " + PsConfig::describe_mode_word(cfg_.mode_word())) +
        (cfg_.emulate_rate_bps > 0 ? "; EMULATED link rate " + std::to_string(cfg_.emulate_rate_bps / 1e9) + " Gbit/s"
                                   : ""));
  const auto hb = van_.heartbeat();
  while (van_.poll(hb)) {
    send_outcomes();
    if (van_.all_left(PeerRole::worker)) {  // the goodbye barrier: the servers go too
      van_.leave();
      log("every worker has left; exiting");
      return 0;
    }
    if (const auto now = Clock::now(); now >= next_lag_check_) {
      warn_laggards(now);
      report_lags(now);
      check_stalls(now);
      next_lag_check_ = now + hb;
    }
  }
  return 1;
}

void Server::on_ready() { log("rendezvous complete: " + std::to_string(env_.num_workers) + " workers"); }

void Server::on_failed(const Status& status) {
  log("error: " + status.message + "; stopping");
  engine_.stop();  // no thread may touch a payload once the transport closes
  if (failure_hook_) failure_hook_();
}

void Server::on_message(PeerId id, const control::Roster::Member& sender, const Header& h,
                        std::unique_ptr<Payload> payload) {
  if (sender.role == PeerRole::worker) {
    switch (h.type) {
      case MsgType::assign_req:
        if (env_.rank == 0) return on_assign(id, h);
        break;
      case MsgType::join:
        if (van_.ready()) return on_join(sender.rank);
        break;
      case MsgType::push_pull:
      case MsgType::bcast:
        lag_.pushed(sender.rank, h.iteration, Clock::now());
        return on_data(id, h, std::move(payload));
      case MsgType::push_pull_batch:
        lag_.pushed(sender.rank, h.iteration, Clock::now());
        return on_batch(id, h, std::move(payload));
      default: break;
    }
  }
  van_.malformed(id, "unexpected " + std::string(msg_type_name(h.type)) + " message");
}

void Server::on_assign(PeerId id, const Header& h) {
  Header r = van_.header(MsgType::assign_rep);
  r.key = h.key;
  r.offset = h.offset;
  r.request_id = h.request_id;
  r.aux = static_cast<uint32_t>(sharder_.assign(h.key, h.offset, h.length));
  van_.send(id, r);
}

// The worker's credit waits for this, not for the other workers' pushes.
void Server::ack_receipt(PeerId id, const Header& h) {
  if (!(h.flags & kFlagAckReceipt)) return;
  Header r = van_.header(MsgType::received);
  r.key = h.key;
  r.offset = h.offset;
  r.request_id = h.request_id;
  r.priority = h.priority;
  replies_.add(id, r);
}

void Server::on_data(PeerId id, const Header& h, std::unique_ptr<Payload> payload) {
  ack_receipt(id, h);
  const bool async = (h.flags & kFlagAsync) != 0;
  if (async && (cfg_.mode == "sync" || h.type != MsgType::push_pull))
    return van_.malformed(id, "an asynchronous push, but this run is COMMSCHED_PS_MODE=" + cfg_.mode);
  outcomes_.clear();
  engine_.push(async, h, id, std::move(payload), outcomes_);
  send_outcomes();
}

// Each entry is one push_pull of the SlotTable, reading its bytes in place; the batch is answered once, when its
// last entry is (send_outcome routes the entries' answers here).
void Server::on_batch(PeerId id, const Header& h, std::unique_ptr<Payload> payload) {
  DecodedBatch b = decode_batch(h, payload->bytes(), DecodeLimits{cfg_.max_message_bytes});
  if (!b.error.empty()) return van_.malformed(id, b.error);
  auto [it, fresh] = batches_.try_emplace({id, h.request_id});
  if (!fresh)
    return van_.malformed(id, "push_pull_batch request " + std::to_string(h.request_id) + " again while it is open");
  OpenBatch& open = it->second;
  open.request = h;
  open.entries = std::move(b.entries);
  open.sums.resize(open.entries.size());
  open.remaining = open.entries.size();
  ack_receipt(id, h);
  const std::shared_ptr<const Payload> whole(std::move(payload));
  outcomes_.clear();
  for (size_t i = 0; i < open.entries.size(); ++i) {  // answers go out after the loop (they may erase `open`)
    const BatchEntry& e = open.entries[i];
    auto part = std::make_unique<SlicePayload>(whole, whole->bytes().subspan(e.at, e.length));
    engine_.push(false, entry_header(h, e), id, std::move(part), outcomes_, static_cast<uint32_t>(i));
  }
  send_outcomes();
}

void Server::batch_entry_done(const Waiter& w, const Outcome& o) {
  auto it = batches_.find({w.peer, w.request_id});
  if (it == batches_.end() || w.entry >= it->second.sums.size()) return;  // its worker was lost meanwhile
  OpenBatch& b = it->second;
  if (!o.error.empty()) {
    if (b.error.empty()) b.error = o.error;
  } else {
    b.sums[w.entry] = o.data;
  }
  if (--b.remaining > 0) return;
  answer_batch(w.peer, b);
  batches_.erase(it);
}

// One sum_batch in the request's layout, the sums sent in place (a gather list; ZeroMQ copies them into its frame),
// or one error naming the entry that failed.
void Server::answer_batch(PeerId peer, const OpenBatch& b) {
  Header h = van_.header(b.error.empty() ? MsgType::sum_batch : MsgType::error);
  h.request_id = b.request.request_id;
  h.iteration = b.request.iteration;
  if (!b.error.empty()) return van_.send_text(peer, h, b.error);
  const uint64_t bytes = b.request.length, table = b.entries.front().at;
  auto buf = pool_->acquire(table);
  encode_batch_table(b.entries, std::span(buf.get(), table));
  std::vector<const std::byte*> data;
  for (const auto& s : b.sums) data.push_back(s.get());
  h.aux = static_cast<uint32_t>(b.entries.size());
  h.length = bytes;
  h.priority = b.request.priority;
  replies_.add(peer, h,
               gathered(batch_pieces(b.entries, std::span(buf.get(), table), data, bytes), [buf, keep = b.sums] {}));
}

// The worker stands in with zeros from now on; once every worker has joined, each hears `joined` (naming the last)
// and every slot waits for every worker again.
void Server::on_join(uint32_t worker) {
  if (!engine_.join(worker)) return;  // said twice
  lag_.forget(worker);
  outcomes_.clear();
  send_outcomes();  // what the join released goes before `joined`
  if (!engine_.all_joined()) return;
  engine_.end_joins();
  Header h = van_.header(MsgType::joined);
  h.aux = worker;
  h.priority = std::numeric_limits<int32_t>::max();  // behind every sum the joins released, which may still wait
  for (PeerId w : van_.peers(PeerRole::worker)) replies_.add(w, h);
  log("every worker has joined (worker " + std::to_string(worker) + " last)");
}

void Server::send_outcomes() {
  engine_.drain(outcomes_);
  for (Outcome& o : outcomes_) send_outcome(o);
  outcomes_.clear();
  replies_.flush();  // the transport may have let go of payloads meanwhile
}

void Server::send_outcome(Outcome& o) {
  if (!o.error.empty()) log("answering " + std::to_string(o.waiters.size()) + " worker(s) with an error: " + o.error);
  for (const Waiter& w : o.waiters) {
    if (w.entry != kNoEntry) {
      batch_entry_done(w, o);
      continue;
    }
    Header h = o.reply;
    h.sender_role = PeerRole::server;
    h.sender_rank = static_cast<uint32_t>(env_.rank);
    h.request_id = w.request_id;
    if (!o.error.empty()) {
      van_.send_text(w.peer, h, o.error);
    } else if (w.gets_data) {
      replies_.add(w.peer, h, OutPayload{o.data.get(), h.length, [keep = o.data] {}, {}});
    } else {
      replies_.add(w.peer, h);
    }
  }
}

void Server::warn_laggards(Clock::time_point now) {
  for (const LagTracker::Lag& l : lag_.laggards(now, kLagWarningS)) {
    auto& warned = lag_warned_[l.worker];
    if (warned != Clock::time_point{} && now - warned < kLagRepeat) continue;
    warned = now;
    std::ostringstream os;
    os.precision(2);
    os << std::fixed << "warning: " << van_.name(van_.peer(PeerRole::worker, l.worker)) << " is slow but alive: "
       << (l.lead - l.iteration) << " iteration(s) behind (at " << l.iteration << ", others at " << l.lead
       << "); the others reached iteration " << l.iteration + 1 << " " << l.seconds << " s ago";
    if (cfg_.mode == "sync") os << " and wait for it";
    else if (cfg_.mode == "ssp") os << " (ssp: they wait once " << cfg_.staleness << " ahead)";
    else os << " (async: nobody waits for it)";
    log(os.str());
  }
}

void Server::check_stalls(Clock::time_point now) {
  if (stall_watch_.min_wait_s() <= 0) return;
  const std::vector<StalledSlot> stalls = engine_.stalled(now, stall_watch_.min_wait_s());
  if (stalls.empty()) return;
  if (stall_watch_.log_due(std::chrono::duration<double>(now.time_since_epoch()).count(), stalls.front().waited_s)) {
    std::string list;
    for (size_t i = 0; i < stalls.size() && i < 8; ++i) list += (i ? "; " : "") + stalls[i].describe();
    if (stalls.size() > 8) list += "; and " + std::to_string(stalls.size() - 8) + " more";
    log("stalled: " + list + ". " + stall_watch_.advice());
  }
  for (const StalledSlot& s : stalls)
    if (stall_watch_.fails(s.waited_s))
      engine_.fail_stalled(s, "stalled: " + s.describe() + "; failed after COMMSCHED_STALL_SHUTDOWN", outcomes_);
  send_outcomes();
}

// Every worker hears who lags (StragglerBoard merges the servers' reports); an empty report once clears it.
void Server::report_lags(Clock::time_point now) {
  if (!van_.ready()) return;
  std::vector<Straggler> lags;
  for (const LagTracker::Lag& l : lag_.laggards(now, kStragglerReportS))
    lags.push_back(Straggler{static_cast<int>(l.worker), l.lead - l.iteration, l.seconds});
  if (lags.empty() && !lags_reported_) return;
  lags_reported_ = !lags.empty();
  const std::string text = encode_stragglers(lags);
  for (PeerId w : van_.peers(PeerRole::worker)) van_.send_text(w, van_.header(MsgType::lags), text);
}

}  // namespace ps

int run_server(const ClusterEnv& env, const PsConfig& cfg, bool owns_process) {
  env.validate();
  cfg.validate(env.timeout_s);
  if (env.role != Role::server) throw InvalidArgument("run_server needs COMMSCHED_ROLE=server");
  if (env.num_servers < 1) throw InvalidArgument("COMMSCHED_NUM_SERVERS must be at least 1 for a server");
  const ps::TransportOptions opts = cfg.transport_options(env);
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
