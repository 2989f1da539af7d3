#include "bench/ps/goodput_core.h"

#include <cstdio>
#include <deque>
#include <mutex>

#include "scheduler/completion_waiter.h"

namespace commsched::bench {
namespace {

// `n` f32 tensors of `part` bytes each, over zeroed buffers kept in `bufs`.
std::vector<TaskDesc> make_tasks(const std::string& prefix, uint64_t part, uint64_t n,
                                 std::vector<std::vector<std::byte>>& bufs) {
  std::vector<TaskDesc> tasks(n);
  bufs.assign(n, std::vector<std::byte>(part, std::byte{0}));
  for (uint64_t s = 0; s < n; ++s) {
    tasks[s].name = prefix + std::to_string(part) + "." + std::to_string(s);
    tasks[s].key = task_key(tasks[s].name);
    tasks[s].dtype = DType::f32;
    tasks[s].count = part / 4;
    tasks[s].buffer.data = bufs[s].data();
  }
  return tasks;
}

}  // namespace

std::vector<uint64_t> default_sizes() { return {64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20}; }

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double ps_goodput(PsBackend& b, uint64_t part, uint64_t mib) {
  const uint64_t window = window_of(part), total = total_bytes(part, mib);
  std::vector<std::vector<std::byte>> bufs;
  std::vector<TaskDesc> tasks = make_tasks("bench.", part, window, bufs);
  // A completion frees its slot for the next partition: the waiter counts partitions in flight, the deque says
  // which slots are free (filled before the completion settles, so a wake-up always finds one).
  CompletionWaiter waiter;
  std::mutex free_mu;
  std::deque<uint64_t> free_slots;
  auto submit = [&](uint64_t s) {
    waiter.expect(1);
    b.start({PartitionView{&tasks[s], 0, 0, part}}, [&, s](const Status& st) {
      {
        std::lock_guard lock(free_mu);
        free_slots.push_back(s);
      }
      waiter.settle(st);
    });
  };
  const auto t0 = Clock::now();
  uint64_t sent = 0, done = 0;
  for (uint64_t s = 0; s < window && sent < total; ++s, sent += part) submit(s);
  while (done < sent) {
    const uint64_t in_flight = (sent - done) / part;
    if (const Status st = waiter.wait(std::chrono::seconds(60), in_flight - 1); !st.ok()) {
      std::fprintf(stderr, "push_pull of %llu-byte partitions failed: %s\n", static_cast<unsigned long long>(part),
                   st.message.c_str());
      waiter.wait(std::chrono::seconds(60));  // the rest still write into these buffers
      return 0;
    }
    uint64_t s;
    {
      std::lock_guard lock(free_mu);
      s = free_slots.front();
      free_slots.pop_front();
    }
    done += part;
    if (sent < total) {
      ++tasks[s].round;
      submit(s);
      sent += part;
    }
  }
  return static_cast<double>(total) / seconds_since(t0);
}

double ps_round_goodput(PsBackend& b, uint64_t part, uint64_t parts, bool fused, uint64_t mib) {
  std::vector<std::vector<std::byte>> bufs;
  std::vector<TaskDesc> tasks = make_tasks("fused.", part, parts, bufs);
  const uint64_t rounds = std::max<uint64_t>(4, (mib << 20) / (part * parts));
  const auto t0 = Clock::now();
  for (uint64_t r = 0; r < rounds; ++r) {
    CompletionWaiter waiter;
    std::vector<PartitionView> all;
    for (auto& t : tasks) {
      t.round = r;
      all.push_back(PartitionView{&t, 0, 0, part});
    }
    if (fused) {
      b.start(std::move(all), waiter.callback());
    } else {
      for (const PartitionView& v : all) b.start({v}, waiter.callback());
    }
    if (const Status st = waiter.wait(std::chrono::seconds(60)); !st.ok()) {
      std::fprintf(stderr, "a round of %llu-byte partitions failed: %s\n", static_cast<unsigned long long>(part),
                   st.message.c_str());
      return 0;
    }
  }
  return static_cast<double>(rounds * parts * part) / seconds_since(t0);
}

ClusterEnv env_for(Role role, const std::string& addr, int port, int workers, int rank) {
  ClusterEnv e;
  e.role = role;
  e.rank = rank;
  e.num_workers = workers;
  e.num_servers = 1;
  e.root_addr = addr;
  e.root_port = port;
  e.bind = addr;
  return e;
}

bool wanted(const std::string& transports, const std::string& t) {
  return ("," + transports + ",").find("," + t + ",") != std::string::npos;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string size_name(uint64_t b) {
  return b >= (1 << 20) ? std::to_string(b >> 20) + " MiB" : std::to_string(b >> 10) + " KiB";
}

}  // namespace commsched::bench
