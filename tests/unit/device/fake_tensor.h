// Test tensors for the copy stages: host memory whose TaskDesc may say "CUDA" (the stand-in copier reads and writes
// it), filled with small integers that every dtype, bf16 included, sums exactly over a few ranks.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "base/half.h"
#include "scheduler/task.h"

namespace commsched {

inline void store(DType t, std::byte* p, int v) {
  switch (t) {
    case DType::f32: { float x = static_cast<float>(v); std::memcpy(p, &x, 4); break; }
    case DType::f64: { double x = v; std::memcpy(p, &x, 8); break; }
    case DType::f16: { uint16_t x = f32_to_f16(static_cast<float>(v)); std::memcpy(p, &x, 2); break; }
    case DType::bf16: { uint16_t x = f32_to_bf16(static_cast<float>(v)); std::memcpy(p, &x, 2); break; }
    case DType::i32: { int32_t x = v; std::memcpy(p, &x, 4); break; }
    case DType::i64: { int64_t x = v; std::memcpy(p, &x, 8); break; }
  }
}

inline double load(DType t, const std::byte* p) {
  switch (t) {
    case DType::f32: { float x; std::memcpy(&x, p, 4); return x; }
    case DType::f64: { double x; std::memcpy(&x, p, 8); return x; }
    case DType::f16: { uint16_t x; std::memcpy(&x, p, 2); return f16_to_f32(x); }
    case DType::bf16: { uint16_t x; std::memcpy(&x, p, 2); return bf16_to_f32(x); }
    case DType::i32: { int32_t x; std::memcpy(&x, p, 4); return x; }
    case DType::i64: { int64_t x; std::memcpy(&x, p, 8); return static_cast<double>(x); }
  }
  return 0;
}

// Small integers: exact in every dtype, bf16 included, after summing a few ranks.
inline int value_of(int rank, size_t tensor, uint64_t elem, int iter) {
  return static_cast<int>((rank * 3 + tensor * 5 + elem * 7 + static_cast<uint64_t>(iter)) % 9) - 4;
}

// A tensor whose TaskDesc says "CUDA" while its bytes are host memory: the stand-in copier reads and writes them.
struct FakeDeviceTensor {
  std::string name;
  DType dtype;
  uint64_t count;
  std::vector<std::byte> bytes;
  FakeDeviceTensor(std::string n, DType d, uint64_t c) : name(std::move(n)), dtype(d), count(c), bytes(c * dtype_size(d)) {}
  void fill(int rank, size_t index, int iter) {
    for (uint64_t e = 0; e < count; ++e) store(dtype, bytes.data() + e * dtype_size(dtype), value_of(rank, index, e, iter));
  }
  Task task(Op op, Device device = Device::cuda) {
    Task t;
    t.name = name;
    t.op = op;
    t.dtype = dtype;
    t.count = count;
    t.buffer = Buffer{bytes.data(), device, 0};
    return t;
  }
  // The first element whose value is not the sum over `ranks`, or -1.
  int64_t first_wrong(int ranks, size_t index, int iter) const {
    for (uint64_t e = 0; e < count; ++e) {
      double want = 0;
      for (int r = 0; r < ranks; ++r) want += value_of(r, index, e, iter);
      if (load(dtype, bytes.data() + e * dtype_size(dtype)) != want) return static_cast<int64_t>(e);
    }
    return -1;
  }
};

}  // namespace commsched
