// Writes the seed corpora (tests/fuzz/corpus/<target>/) from real encoders, so the fuzzers start from valid messages.
// Run by scripts/fuzz.sh --seeds; its output is committed.
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "comm_backends/cluster_auth.h"
#include "comm_backends/collective/protocol.h"
#include "comm_backends/collective/wire.h"
#include "comm_backends/ps/protocol.h"
#include "comm_backends/straggler.h"
#include "plugins/launch/node_link_lines.h"

namespace fs = std::filesystem;
using namespace commsched;

namespace {

void write(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

std::string ps_seed(const ps::Header& h, std::optional<uint64_t> payload) {
  std::string s(9, '\0');
  s[0] = payload ? 1 : 0;
  const uint64_t n = payload.value_or(0);
  std::memcpy(s.data() + 1, &n, 8);
  std::array<std::byte, ps::kHeaderBytes> buf;
  ps::encode_header(h, buf);
  s.append(reinterpret_cast<const char*>(buf.data()), buf.size());
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path out = argc > 1 ? argv[1] : "tests/fuzz/corpus";
  using ps::MsgType;
  auto header = [](MsgType t) {
    ps::Header h = ps::make_header(t, ps::PeerRole::worker, 3);
    h.key = 42;
    h.dtype = DType::f16;
    h.offset = 1024;
    h.length = 4096;
    h.tensor_bytes = 8192;
    h.round = 7;
    h.request_id = 99;
    h.flags = t == MsgType::push_pull ? ps::kFlagAckReceipt : 0;
    return h;
  };
  int i = 0;
  for (MsgType t : {MsgType::hello, MsgType::assign_req, MsgType::assign_rep, MsgType::push_pull,
                    MsgType::sum, MsgType::bcast, MsgType::bcast_data, MsgType::ping, MsgType::error,
                    MsgType::peer_lost, MsgType::bye, MsgType::received, MsgType::join, MsgType::joined,
                    MsgType::lags}) {
    const bool data = ps::carries_data(t);
    write(out / "ps_header", "type" + std::to_string(i++),
          ps_seed(header(t), data ? std::optional<uint64_t>(4096) : std::nullopt));
  }
  ps::Header topk = header(MsgType::push_pull);  // 512 top-k pairs of a 2048-element f32 range, decoded by a server
  topk.dtype = DType::f32;
  topk.codec = 3;
  topk.elements = 2048;
  write(out / "ps_header", "push_pull_topk", ps_seed(topk, 4096));
  ps::Header async = header(MsgType::push_pull);  // a gradient of an async/ssp run, answered with running sums
  async.flags = ps::kFlagAsync | ps::kFlagAckReceipt;
  write(out / "ps_header", "push_pull_async", ps_seed(async, 4096));
  // A push_pull_batch of an f32 and an f16 range, with its payload bytes (the fuzz target's mode bit 2).
  std::vector<ps::BatchEntry> es = {{42, 0, 400, 800, 7, DType::f32, 0}, {43, 64, 6, 128, 7, DType::f16, 0}};
  std::vector<std::byte> body(ps::batch_layout(es));
  ps::encode_batch_table(es, body);
  ps::Header batch = ps::make_header(MsgType::push_pull_batch, ps::PeerRole::worker, 3);
  batch.request_id = 99;
  batch.aux = static_cast<uint32_t>(es.size());
  batch.length = body.size();
  batch.flags = ps::kFlagAckReceipt;
  std::string seed = ps_seed(batch, body.size());
  seed[0] = 3;
  seed.append(reinterpret_cast<const char*>(body.data()), body.size());
  write(out / "ps_header", "push_pull_batch", seed);
  batch.type = MsgType::sum_batch;
  batch.flags = 0;
  seed = ps_seed(batch, body.size());
  seed[0] = 3;
  seed.append(reinterpret_cast<const char*>(body.data()), body.size());
  write(out / "ps_header", "sum_batch", seed);

  using namespace collective;
  PartitionDesc d{7, 0, 4000, 8000, DType::f32, Op::allreduce, 0};
  ReadyReport full{kNoCacheId, d, "layer1.weight", 3, 5};
  ReadyReport cached{12, {}, "", 4, 1};
  std::string stream = encode_hello(1, 4) + encode_ready({full, cached}) +
                       encode_order(OrderMsg{{CacheDefine{12, d}}, {{OrderEntry{12, 3}}, {OrderEntry{13, 4}}}}) +
                       encode_error(ErrorMsg{7, 0, 3, Status::Code::error, "sizes disagree"}) +
                       encode_peer_lost(2, "rank 2 lost") + encode_simple(collective::MsgType::heartbeat) +
                       encode_simple(collective::MsgType::bye);
  write(out / "collective_wire", "stream_chunk1", std::string(1, '\0') + stream);
  write(out / "collective_wire", "stream_chunk7", std::string(1, '\6') + stream);
  write(out / "collective_wire", "ready", std::string(1, '\x3f') + encode_ready({full}));
  write(out / "collective_wire", "order", std::string(1, '\x10') + encode_order(OrderMsg{{}, {{OrderEntry{1, 2}}}}));

  // lag reports: selector byte (ranks, source), then the text a server or the coordinator sends.
  const std::string lags = encode_stragglers({{1, 3, 0.25}, {3, 1, 1.5}});
  write(out / "stragglers", "two", std::string(1, '\x03') + lags);
  write(out / "stragglers", "two_source1", std::string(1, '\x43') + lags);
  write(out / "stragglers", "empty", std::string(1, '\x07'));
  write(out / "stragglers", "one", std::string(1, '\x00') + encode_stragglers({{0, 12, 0.02}}));

  // link_auth: side byte (0 listener, 1 honest connector, 2 connector), then what the other side sent.
  const SecretHandshake other("another-secret-0123456789", "store");
  const std::string nonce = SecretHandshake::nonce();
  ByteWriter answer;
  answer.put_string(nonce);
  answer.put_string(other.client_proof(nonce, nonce));
  const std::string answer_frame = answer.take_frame();
  write(out / "link_auth", "answer_other_secret", std::string(1, '\0') + answer_frame.substr(4));
  write(out / "link_auth", "honest_nonce", std::string(1, '\1') + nonce);
  ByteWriter challenge;
  challenge.put<uint8_t>(0);
  challenge.put_string(nonce);
  ByteWriter reply;
  reply.put_string(other.server_proof(nonce, nonce));
  write(out / "link_auth", "challenge_and_reply", std::string(1, '\2') + challenge.take_frame() + reply.take_frame());
  write(out / "link_auth", "challenge_only", std::string(1, '\2') + answer_frame);

  // node_link: chunk byte, then a stream of lines both ways.
  write(out / "node_link", "hello", std::string(1, '\x05') + "HELLO 1 2 0\nGO 4:1,2:1 A=1\tB=x=y\nWDONE 1\nDONE 1\n");
  write(out / "node_link", "hello_extra_words", std::string(1, '\x10') + "HELLO 2 abc def\nHELLO -1\nHELLO\n");
  write(out / "node_link", "go_env",
        std::string(1, '\x3f') + "GO 1:0,1:0 " + node_link::encode_env({{"K", "v"}, {"E", ""}}) + "\n");
  write(out / "node_link", "abort", std::string(1, '\x00') + "ABORT 2 its launcher is gone\nWALLDONE\nABORT\n");

  // config: selector byte (parser in the low 3 bits, option index above), then the text.
  const std::vector<std::pair<int, std::string>> cfg = {
      {0, "4MiB"}, {0, "1.5MB"}, {1, "unlimited"}, {2, "10Gbit"}, {10, "inf"}, {3, "1.5ms"}, {3, "250ns"},
      {4, "-17"}, {5, "true"}, {5, "0"}, {6, "1"}, {6 + 8, "1gbit"}, {6 + 32, "250ms"}, {6 + 64, "64KiB"},
      {7, "bytescheduler"}, {7 + 8, "4MiB"}, {7 + 32, "5ms"}, {7 + 72, "25Gbit"}};
  i = 0;
  for (auto& [sel, text] : cfg) write(out / "config", "c" + std::to_string(i++), std::string(1, static_cast<char>(sel)) + text);
  return 0;
}
