// Order negotiation for collective backends: every rank submits the partitions its engine dispatched, in its own
// order; the negotiator hands them back to the backend in one order agreed by all ranks (decided by a GlobalOrder on
// rank 0).
//
// One thread per rank drives plain TCP connections (a star around rank 0): a report and the order answering it cost
// one message each way, tens of microseconds on loopback. Rank 0 runs the coordinator in the same thread and applies
// its own reports and orders without a socket. Liveness: every connection carries heartbeats when idle; a closed
// connection or timeout_s without word declares the peer dead, and every rank then fails all pending work with
// Status::Code::peer_lost naming it. Who learns of a loss (or of any failure) first passes it on by the control
// plane's rule (control::LossRelay: rank 0 tells every other rank; a rank tells rank 0, which tells the rest), and the
// shutdown is the control plane's goodbye barrier (control::GoodbyeBarrier: rank 0 answers every rank's bye with
// all_bye once all have said it; the others wait for that).
// Authentication: with the run's secret (NegotiatorOptions::secret) each connection proves it, both ways, before its
// hello (collective/link_auth.h); rank 0 logs a connection that cannot, naming its address, drops it and keeps
// waiting for the real ranks.
//
// Latency: every thread hand-off on the critical path costs a wake-up, and on a busy machine a wake-up can cost a
// scheduler slice (about a millisecond), far more than the message itself. So:
// - other ranks send a report to rank 0 from the submitting thread (no hand-off to the negotiator thread; the rest of
//   a burst of submissions still goes through the negotiator thread as one report, so rank 0 can fuse it);
// - on rank 0 the submitting thread runs the coordinator's step itself (reading whatever the peers' sockets hold) and
//   sends the order it makes, when the negotiator thread is not in a step of its own (the thread's state is guarded
//   by one lock, which the thread holds except while it sleeps or runs collectives); the negotiator thread then only
//   runs rank 0's copy of the order, and the next order reaches the peers while a collective still runs;
// - a backend may run the groups it is given on the negotiator thread itself (execute_blocks: no hand-off to an
//   executor thread; a heartbeat thread then keeps the connections alive while a collective runs);
// - the negotiator thread polls without sleeping for spin_s before each sleep (back-to-back collectives: the next
//   report or order usually comes within microseconds of the last collective's end);
// - a caller about to wait for its groups does the negotiator thread's rounds itself (help_until, the backend's
//   WaitHelper): it reads the order and runs the groups on its own thread, as plain Gloo's caller would, so neither
//   the order's arrival nor the collective's end needs a wake-up. Meanwhile the negotiator thread waits on its
//   eventfd alone, and the caller wakes it when it stops; run_mu_ keeps the groups in order whoever runs them.
#pragma once

#include <poll.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "scheduler/global_order.h"
#include "scheduler/stall.h"
#include "scheduler/wait_helper.h"
#include "comm_backends/collective/kv_store.h"
#include "comm_backends/collective/protocol.h"
#include "comm_backends/collective/wire.h"
#include "comm_backends/control/goodbye_barrier.h"
#include "comm_backends/control/loss_relay.h"
#include "comm_backends/lag_tracker.h"
#include "comm_backends/straggler.h"
#include "comm_backends/liveness.h"

namespace commsched::collective {

struct NegotiatorOptions {
  int rank = 0;
  int size = 1;
  double timeout_s = 10.0;           // ClusterEnv::timeout_s: silence after which a peer is dead
  double join_timeout_s = 60.0;      // how long ranks wait for each other at start-up
  // The knobs of rank 0's policy until its driver posts its own (order_inbox(); an engine does at once): the credit
  // (bytes ordered but not completed, 0: no limit) and the small-tensor fusion bound. The policy itself is the
  // engine's, handed over through order_inbox() (scheduler/global_order.h).
  Knobs knobs;
  // What a fusion bound of 0 means: the collective's automatic fusion (CollectiveOptions::negotiator_options).
  uint64_t auto_fusion_bytes = 0;
  std::string host = "127.0.0.1";    // rank 0: address to bind and advertise the coordinator on
  // The run's shared secret (ClusterAuth::secret_for, as the rendezvous store has it; empty: none). With one, every
  // connection proves it before its hello (link_auth.h): rank 0 logs and drops a stranger and keeps waiting.
  std::string secret;
  std::string key_prefix = "commsched/negotiator/";
  // The execute callback may block (runs the collective itself): heartbeats then come from a separate thread, and
  // peers' silence is judged only after what they sent meanwhile has been read.
  bool execute_blocks = false;
  // How long the negotiator thread polls its sockets without sleeping before each sleep (0: sleep at once).
  double spin_s = 100e-6;
  // Rank 0 orders a partition every rank ran before under the same description once it is ready on rank 0, without
  // waiting for the others' reports (GlobalOrder "Vouching"); the others run such an order as their submissions
  // come. A submission that then differs from what rank 0 ordered fails the group, naming the partition.
  bool vouch = true;
  // Rank 0 logs the tensors some ranks submitted and others have not and, after stall.shutdown_s, fails them on
  // every rank (scheduler/stall.h).
  StallOptions stall;
};

// One partition ready on this rank. `token` is the caller's handle, given back by the callbacks.
struct Submission {
  uint64_t token = 0;
  PartitionDesc desc;
  std::string name;
  uint64_t round = 0;
  int32_t priority = 0;
};

struct NegotiatorCallbacks {
  // A group of tokens to run now as one collective (fused when more than one), in the agreed order. Called on the
  // negotiator thread with no lock held: hand the work off and do not block, unless execute_blocks is set.
  std::function<void(std::vector<uint64_t>&& group)> execute;
  // A token that will never be executed (mismatch, shutdown, lost peer).
  std::function<void(uint64_t token, const Status& status)> fail;
  // Called once, before pending tokens fail, when the group is broken (a rank died): ordered work must not start.
  std::function<void(const Status& status)> fatal;
  // After join(): a token for a partition this rank does not have (the others run it), backed by zeros of its
  // description; executed like any other. Called on the negotiator thread with the negotiator's lock held.
  std::function<uint64_t(const PartitionDesc& desc)> stand_in;
};

struct NegotiatorStats {
  uint64_t submitted = 0;
  uint64_t cached_reports = 0;  // reports sent by cache id
  uint64_t orders = 0;          // order messages applied
  uint64_t groups = 0;          // groups executed
  uint64_t vouched = 0;         // rank 0: partitions ordered on its readiness alone (NegotiatorOptions::vouch)
  uint64_t reasons_kept = 0;    // rank 0's reasons held for partitions ordered here whose collective is not over
};

class Negotiator final : public RankJoin, public StragglerReport, public WaitHelper {
 public:
  // Joins every rank through `store` (blocks up to join_timeout_s); throws std::runtime_error naming missing ranks.
  Negotiator(NegotiatorOptions opts, control::Store& store, NegotiatorCallbacks callbacks);
  ~Negotiator();
  Negotiator(const Negotiator&) = delete;
  Negotiator& operator=(const Negotiator&) = delete;

  // Thread-safe. After a fatal error or shutdown, fails the submissions inline. On ranks other than 0 the report is
  // written to rank 0's socket from the calling thread (a control message: the write does not wait for the peer).
  void submit(std::vector<Submission> subs);
  // This rank finished the oldest executed group (rank 0's completions drive the coordinator's policy; elsewhere a
  // no-op). Call once per group handed to the execute callback, in order.
  void completed();
  // Horovod's join: this rank has no more data. Until every rank has joined it runs the others' partitions with
  // zeros (NegotiatorCallbacks::stand_in); returns the rank that joined last. Throws std::runtime_error when the
  // group breaks or shuts down meanwhile. Call with nothing of this rank pending; no time limit (a lost peer ends it).
  int join() override;
  // Where the policy that orders and its knobs are handed over (credit_bytes: the global credit, 0: no limit;
  // small_tensor_bytes 0: NegotiatorOptions::auto_fusion_bytes), from any thread; rank 0 takes them at its next step,
  // the others keep them unused.
  GlobalOrderInbox& order_inbox() { return order_inbox_; }
  // Goodbye barrier: waits (up to timeout_s) until every rank has said bye, then fails anything still pending with
  // Status::Code::cancelled. Idempotent.
  void shutdown();
  // A caller about to wait for its groups receives the order and runs them itself (scheduler/wait_helper.h): only
  // where the groups run on the negotiator thread (execute_blocks), and not from inside a callback.
  void help_until(const std::function<bool()>& done, std::chrono::nanoseconds idle) override;
  // A collective failed in the transport: reads what the peers send and judges their silence, for up to a heartbeat
  // interval or until the group fails, so that a lost peer (its socket closed, silent past the timeout, or named by
  // rank 0's relay) explains the failure better than the transport's error. Rank 0 may start a collective before a
  // rank has reported it (NegotiatorOptions::vouch), so the transport can be first to see that rank gone. From the
  // thread that ran the collective, no lock held.
  void judge_peers();
  // Why the collective of partition (key, offset) of `round` cannot finish, when rank 0 said so after ordering it: a
  // rank shut down before it ran (it had vouched, GlobalOrder); "" when it has said nothing. Thread-safe.
  std::string ordered_failure(uint64_t key, uint64_t offset, uint64_t round);
  // The collective of a group's partitions is over on this rank (run or failed): a reason rank 0 gave for one of them,
  // or for an earlier round of it, can explain nothing any more and is dropped. Thread-safe; one lock for the group,
  // none while rank 0 has given no reason (every collective ends here, so the usual case costs one atomic load).
  void ran(std::span<const PartitionView> group);
  NegotiatorStats stats() const;
  // The ranks that lag, as rank 0 last reported them (on rank 0: as it sees them). Thread-safe.
  std::vector<Straggler> stragglers() const override;
  int rank() const { return opts_.rank; }
  int size() const { return opts_.size; }

 private:
  struct Peer {
    Fd fd;
    FrameAssembler in;
    bool closed = false;  // the socket is done with (its liveness is no longer watched)
  };
  using Slot = PartitionSlot;
  using SlotHash = PartitionSlotHash;
  struct Local {
    uint64_t token;
    uint64_t round;
    PartitionDesc desc;
    std::string name;  // for the error when rank 0 vouched for something else
  };
  struct CacheSlot {
    uint32_t id;
    PartitionDesc desc;
  };
  // A group rank 0 ordered before this rank submitted all of it (it vouched, GlobalOrder): it runs, in order, once
  // the missing submissions come.
  struct OrderedAhead {
    std::vector<uint64_t> tokens;
    std::vector<bool> have;
    size_t missing = 0;
  };
  struct Awaited {
    uint64_t round;
    PartitionDesc desc;
    OrderedAhead* group;  // in ordered_ahead_ (a deque: stable while others are added and removed at its ends)
    size_t index;
  };

  void join_as_coordinator(control::Store& store, std::chrono::steady_clock::time_point deadline);
  void join_as_worker(control::Store& store, std::chrono::steady_clock::time_point deadline);
  // Holds state_mu_ and marks this thread its owner (a callback made under it that submits is seen as such).
  class StateLock;
  void run();
  void loop(StateLock& state);
  // The descriptors a round waits on: [0] the wake eventfd, then every open peer (fd_rank: its rank).
  void poll_set(std::vector<pollfd>& fds, std::vector<int>& fd_rank) const;
  // One round after the wait: what the wake-up and the peers brought, rank 0's ordering, keep-alive, shutdown, and
  // the groups ordered (run on this thread).
  void handle_events(StateLock& state, const std::vector<pollfd>& fds, const std::vector<int>& fd_rank);
  // Empties the wake-up eventfd.
  void drain_wake();
  // A helping caller's round: handle_events when anything came or waits; idle when nothing did (or the state is busy).
  // When idle, `wait` gets what to sleep on until the next piece of work could come: the wake-up and the peers
  // (revents cleared), and for at most how long (the coordinator's next timer).
  enum class HelpResult { worked, idle, finished };
  struct HelpWait {
    std::vector<pollfd> fds;
    int max_ms = 0;
  };
  HelpResult help_round(HelpWait& wait);
  // Sleeps in poll on `wait` for up to `left` (shorter where the coordinator's timer is due sooner).
  static void sleep_for_work(HelpWait& wait, std::chrono::nanoseconds left);
  // Polls `fds` (spinning for up to spin_s first, then sleeping up to timeout_ms).
  void wait_events(std::vector<pollfd>& fds, int timeout_ms) const;
  // Rank 0: runs the coordinator's step for `subs` (and this rank's iteration mark after them, when given: true for
  // an end of backward) on the calling thread. False (nothing done) when the negotiator thread is in a step, the
  // caller is inside one (a callback), or earlier submissions still wait in the inbox.
  bool step_on_caller(std::vector<Submission>& subs, std::optional<bool> backward_mark = std::nullopt);
  // Rank 0: takes the policy handed over, applies knob changes and completions, asks the policy what to order, and
  // publishes it.
  void coordinator_round();
  // Milliseconds the poll may sleep: until the next heartbeat check or the policy's next wake-up.
  int poll_timeout_ms() const;
  void take_inbox();
  void read_peer(int rank);
  // read_peer; a malformed message fails the group naming the sender.
  void read_peer_guarded(int rank);
  // Reads whatever the peers' sockets hold now (no waiting): rank 0 from a submitting thread, any rank in
  // judge_peers.
  void read_waiting_peers();
  void handle_frame(int from, const std::string& frame);
  void coordinator_message(int from, MsgType type, ByteReader& r);
  void worker_message(MsgType type, ByteReader& r);
  void finish_join(int last);
  // Builds the reports for `subs` (records them pending); duplicates go to `failed`. Caller holds mu_.
  std::vector<ReadyReport> reports_locked(std::span<Submission> subs, std::vector<std::pair<uint64_t, Status>>& failed);
  // This rank's end of backward or flush (GlobalOrderInbox::mark), after every submission it covers: sent to rank 0
  // with the count of reports before it (rank 0: told to its coordinator).
  void mark(bool backward);
  // Sends a frame to rank 0 from any thread (rank != 0); a failure is left for the negotiator thread to report.
  void send_to_coordinator_async(const std::string& frame);
  void heartbeat_loop();
  // Runs the ordered groups with state_mu_ released (held on entry and return), one thread at a time (run_mu_), so
  // they run in order whichever thread (the negotiator's or a helping caller) takes them.
  void run_ready_groups(StateLock& state);
  void publish(GlobalOrderOutput& out);
  void apply_order(const OrderMsg& m);
  // The token for one entry of an order, or none yet (rank 0 vouched: this rank's submission has not come). Holds mu_.
  std::optional<uint64_t> ordered_token_locked(const OrderEntry& e);
  // A submission that rank 0 ordered already: fills its place in the waiting group (true). Holds mu_.
  bool fill_awaited_locked(const Submission& s);
  // Moves the groups ordered ahead that are complete, from the front, to ready_groups_. Holds state_mu_ and mu_.
  void promote_ahead_locked();
  // A submission here differed from what rank 0 vouched for: throws, so the round fails the group (fail_broken).
  void throw_if_vouch_error();
  // A joined rank's awaited partitions: stand-ins (zeros) for what the others run. Holds mu_.
  void stand_in_awaited_locked();
  // "task 'x' differs across ranks: rank 0 ordered ... , this rank submitted ..."
  std::string vouch_mismatch(const std::string& name, const PartitionDesc& ordered, uint64_t ordered_round,
                             const PartitionDesc& mine, uint64_t my_round) const;
  void apply_error(const ErrorMsg& e);
  void send_to(int rank, const std::string& frame);
  void peer_lost(int rank, const std::string& why);
  // Fails the group: tells the members the relay names (not `culprit`), then fails locally. Once.
  void fail_group(const Status& st, std::optional<int> culprit);
  // A round (on the negotiator thread, a submitter or a helping caller) threw: fails the group naming this rank.
  void fail_broken(const std::exception& e);
  void reported(int from, const std::string& text);
  // The relay's verdict: sent to whom it names (raw sends: a second failure cannot recurse), then failed locally.
  void stop(const std::optional<control::LossRelay::Verdict>& verdict, Status::Code code, int culprit);
  // The ranks whose sockets are still open (rank 0: the others; elsewhere: rank 0).
  std::vector<control::LossRelay::Id> open_peers() const;
  void go_fatal(const Status& st);
  void keep_alive(std::chrono::steady_clock::time_point now);
  void progress_shutdown(std::chrono::steady_clock::time_point now);
  void fail_all_pending(const Status& st);
  std::string who(int rank) const;
  // Stragglers. Rank 0: a rank's ready reports are its progress (their highest round), and each heartbeat the
  // laggards go to every rank; every rank keeps rank 0's latest report.
  void note_ready(int rank, const std::vector<ReadyReport>& reports);
  void report_lags(std::chrono::steady_clock::time_point now);
  // Rank 0: logs the stalled tensors (NegotiatorOptions::stall, scheduler/stall.h) and fails those past its shutdown.
  void check_stalls();
  void heard_lags(std::vector<Straggler> lags);

  NegotiatorOptions opts_;
  NegotiatorCallbacks cb_;
  std::chrono::milliseconds heartbeat_;

  // Shared with callers of submit()/shutdown() (and the heartbeat thread).
  mutable std::mutex mu_;
  std::vector<Submission> inbox_;  // for the negotiator thread to report: all of rank 0's, bursts elsewhere
  std::vector<std::pair<size_t, bool>> inbox_marks_;  // marks among them: (submissions before it, backward)
  int64_t last_inline_report_ns_ = 0;
  bool stopping_ = false;
  bool dead_ = false;       // fatal error or finished: submissions fail inline
  Status dead_status_;
  bool join_asked_ = false;  // join() waits: the negotiator thread tells the coordinator
  bool joined_ = false;      // between join() and every rank having joined: stand in for what the others run
  bool join_done_ = false;
  int join_last_ = -1;
  std::condition_variable join_cv_;
  std::string async_send_error_;  // a send from another thread failed; the negotiator thread reports the peer lost
  std::unordered_map<Slot, Local, SlotHash> pending_;
  std::unordered_map<Slot, CacheSlot, SlotHash> cache_;
  std::deque<OrderedAhead> ordered_ahead_;  // groups ordered before this rank submitted all of them, in order
  std::unordered_map<Slot, Awaited, SlotHash> awaited_;
  std::string vouch_error_;  // a submission differed from rank 0's vouched order: the next round fails the group
  // Rank 0's errors for partitions ordered already (not pending here): their collective's failure is explained by
  // them (ordered_failure). The round each is for, and the message.
  std::unordered_map<Slot, std::pair<uint64_t, std::string>, SlotHash> ordered_failures_;
  std::atomic<bool> any_ordered_failures_{false};  // !ordered_failures_.empty(), readable without mu_
  void reasons_changed_locked();  // after every change to ordered_failures_ (mu_ held): keeps the flag in step
  std::vector<Slot> cache_slots_;  // cache id -> slot
  Fd wake_;                 // eventfd: wakes the thread for new submissions and shutdown
  // eventfd: the last helping caller stopped. While callers help the thread sleeps on this alone, and leaves wake_
  // to the callers, who may sleep on it and on the peers (help_until).
  Fd helper_left_;

  // Serialises writes to one socket from several threads (lock order: mu_, then send_mu_).
  std::mutex send_mu_;
  std::atomic<int64_t> last_sent_ns_{0};  // steady_clock, any send to any peer

  // The negotiator thread's state below (to ready_groups_ and finished_): the thread holds state_mu_ except while it
  // sleeps in poll or runs groups; rank 0's submitting threads take it for a step of their own (step_on_caller).
  // Lock order: state_mu_, mu_, send_mu_.
  std::mutex state_mu_;
  // Held by the thread running ordered groups. Lock order: run_mu_, then state_mu_.
  std::mutex run_mu_;
  // Callers helping (help_until) right now: meanwhile the negotiator thread neither spins nor reads the peers; it
  // sleeps on helper_left_.
  std::atomic<int> helping_{0};
  std::atomic<int64_t> helped_at_ns_{INT64_MIN / 2};  // steady_clock, when a caller last stopped helping
  std::vector<pollfd> help_fds_;  // help_round's, under state_mu_
  std::vector<int> help_fd_rank_;
  std::atomic<std::thread::id> state_owner_{};
  std::vector<Peer> peers_;  // rank 0: indexed by rank (entry 0 unused); others: [0] is the coordinator
  // Silence of peers_ by rank. A closed socket is judged where it is read (TCP delivers a peer's last frames before
  // its end, so no grace is needed) and leaves the watch, as does a rank that said bye.
  Liveness live_;
  // Rank 0 awaits every other rank's bye; the others await rank 0's all_bye.
  control::GoodbyeBarrier bye_;
  control::LossRelay relay_;  // stopped: the group has failed (fatal)
  std::unique_ptr<GlobalOrder> coordinator_;
  std::vector<std::vector<uint64_t>> ready_groups_;  // ordered, handed to cb_.execute once no lock is held
  bool bye_sent_ = false;  // this rank is shutting down (rank 0: its own bye told to the coordinator)
  bool finished_ = false;

  std::optional<LagTracker> lag_;  // rank 0, under state_mu_
  bool lags_reported_ = false;     // rank 0: the last report named somebody
  std::chrono::steady_clock::time_point next_lag_report_{};
  StallWatch stall_watch_{StallOptions{}};  // rank 0: when check_stalls() logs and fails
  mutable std::mutex lags_mu_;
  StragglerBoard lags_{1};

  std::atomic<uint64_t> completed_groups_{0};
  GlobalOrderInbox order_inbox_;  // on rank 0 a post wakes the negotiator thread
  std::atomic<uint64_t> submitted_{0}, cached_reports_{0}, orders_{0}, groups_{0}, vouched_{0};
  std::thread thread_;

  // execute_blocks: heartbeats while the negotiator thread runs a collective.
  std::mutex hb_mu_;
  std::condition_variable hb_cv_;
  bool hb_stop_ = false;
  std::thread heartbeat_thread_;
};

}  // namespace commsched::collective
