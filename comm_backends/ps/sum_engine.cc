#include "comm_backends/ps/sum_engine.h"

#include <algorithm>

namespace commsched::ps {

SumEngine::SumEngine(const Options& opts, Summer& summer, std::shared_ptr<BufferPool> pool, std::function<void()> ready)
    : inline_bytes_(opts.inline_bytes), sole_worker_(opts.num_workers == 1), ready_(std::move(ready)) {
  const int n = std::max(1, opts.shards);
  for (int i = 0; i < n; ++i) shards_.push_back(std::make_unique<Shard>(opts, summer, pool));
  for (auto& s : shards_) s->thread = std::thread([this, sp = s.get()] { loop(*sp); });
}

SumEngine::~SumEngine() { stop(); }

// A sync partition by (key, offset), an async tensor by key (its accumulators cover the whole tensor).
SumEngine::Shard& SumEngine::shard_of(const Header& h, bool async) {
  uint64_t x = h.key * 0x9e3779b97f4a7c15ull;
  if (!async) x ^= h.offset * 0xc2b2ae3d27d4eb4full;
  return *shards_[(x >> 32) % shards_.size()];
}

void SumEngine::push(bool async, const Header& h, PeerId peer, std::unique_ptr<Payload> payload,
                     std::vector<Outcome>& out, uint32_t entry) {
  Shard& s = shard_of(h, async);
  Work w{async ? Work::Kind::async_push : Work::Kind::sync_push, h, peer, std::move(payload), entry, 0};
  // Inline only behind nothing: the shard's thread pops work under state_mu, so an empty queue seen under it means
  // every earlier push of this shard has been summed. A sole worker's sync push is its own sum (SlotTable answers
  // with it, zero-copy, encoded or not), so at any size handing it to a shard would only add two thread hand-offs.
  if (h.length <= inline_bytes_ || (sole_worker_ && !async)) {
    std::unique_lock state(s.state_mu, std::try_to_lock);
    if (state.owns_lock()) {
      std::unique_lock queue(s.queue_mu);
      if (s.queue.empty()) {
        queue.unlock();
        return run(s, w, out);
      }
    }
  }
  enqueue(s, std::move(w));
}

void SumEngine::enqueue(Shard& s, Work w) {
  {
    std::lock_guard lock(s.queue_mu);
    s.queue.push_back(std::move(w));
  }
  s.queue_cv.notify_one();
}

void SumEngine::run(Shard& s, Work& w, std::vector<Outcome>& out) {
  switch (w.kind) {
    case Work::Kind::sync_push: return s.slots.push(w.h, w.peer, std::move(w.payload), out, w.entry);
    case Work::Kind::async_push: return s.async.push(w.h, w.peer, std::move(w.payload), out);
    case Work::Kind::join:
      s.joined_result = s.slots.join(w.rank, out);
      if (s.joined_result) s.async.join(w.rank, out);
      return;
    case Work::Kind::end_joins:
      s.slots.end_joins();
      s.async.end_joins();
      return;
  }
}

void SumEngine::loop(Shard& s) {
  std::vector<Outcome> out;
  for (;;) {
    {
      std::unique_lock queue(s.queue_mu);
      s.queue_cv.wait(queue, [&] { return s.stopping || !s.queue.empty(); });
      if (s.stopping) {
        s.queue.clear();  // releases the payloads of work never started
        return;
      }
    }
    bool barrier = false;
    {
      std::lock_guard state(s.state_mu);
      for (;;) {  // everything queued meanwhile, under one hold of the tables
        Work w;
        {
          std::lock_guard queue(s.queue_mu);
          if (s.queue.empty() || s.stopping) break;
          w = std::move(s.queue.front());
          s.queue.pop_front();
        }
        barrier |= w.kind == Work::Kind::join || w.kind == Work::Kind::end_joins;
        run(s, w, out);
      }
    }
    if (out.empty() && !barrier) continue;
    {
      std::lock_guard lock(done_mu_);
      std::move(out.begin(), out.end(), std::back_inserter(done_));
      if (barrier) --barrier_left_;
    }
    out.clear();
    if (barrier) done_cv_.notify_all();
    if (ready_) ready_();
  }
}

void SumEngine::everywhere(Work::Kind kind, uint32_t rank) {
  {
    std::lock_guard lock(done_mu_);
    barrier_left_ = shards_.size();
  }
  for (auto& s : shards_) enqueue(*s, Work{kind, Header{}, 0, nullptr, kNoEntry, rank});
  std::unique_lock lock(done_mu_);
  done_cv_.wait(lock, [&] { return barrier_left_ == 0; });
}

bool SumEngine::join(uint32_t rank) {
  everywhere(Work::Kind::join, rank);
  return shards_.front()->joined_result;  // every shard saw the same joins
}

bool SumEngine::all_joined() {
  std::lock_guard state(shards_.front()->state_mu);
  return shards_.front()->slots.all_joined();
}

void SumEngine::end_joins() { everywhere(Work::Kind::end_joins, 0); }

std::vector<StalledSlot> SumEngine::stalled(SlotTable::Clock::time_point now, double min_wait_s) {
  std::vector<StalledSlot> all;
  for (auto& s : shards_) {
    std::lock_guard state(s->state_mu);
    std::vector<StalledSlot> mine = s->slots.stalled(now, min_wait_s);
    std::move(mine.begin(), mine.end(), std::back_inserter(all));
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const StalledSlot& a, const StalledSlot& b) { return a.waited_s > b.waited_s; });
  return all;
}

void SumEngine::fail_stalled(const StalledSlot& slot, const std::string& message, std::vector<Outcome>& out) {
  Header h;
  h.key = slot.key;
  h.offset = slot.offset;
  Shard& s = shard_of(h, /*async=*/false);
  std::lock_guard state(s.state_mu);
  s.slots.fail_stalled(slot, message, out);
}

void SumEngine::drain(std::vector<Outcome>& out) {
  std::lock_guard lock(done_mu_);
  std::move(done_.begin(), done_.end(), std::back_inserter(out));
  done_.clear();
}

void SumEngine::stop() {
  for (auto& s : shards_) {
    {
      std::lock_guard lock(s->queue_mu);
      s->stopping = true;
    }
    s->queue_cv.notify_all();
  }
  for (auto& s : shards_)
    if (s->thread.joinable()) s->thread.join();
}

}  // namespace commsched::ps
