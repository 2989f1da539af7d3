#include "comm_backends/reduce.h"

namespace commsched {

namespace {
template <typename T>
void add(void* dst, const void* src, size_t n) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (size_t i = 0; i < n; ++i) d[i] += s[i];
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void add16(void* dst, const void* src, size_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  const auto* s = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i) d[i] = FromF(ToF(d[i]) + ToF(s[i]));
}
}  // namespace

void sum_into(DType dtype, void* dst, const void* src, size_t count) {
  switch (dtype) {
    case DType::f32: add<float>(dst, src, count); return;
    case DType::f64: add<double>(dst, src, count); return;
    case DType::i32: add<int32_t>(dst, src, count); return;
    case DType::i64: add<int64_t>(dst, src, count); return;
    case DType::f16: add16<f16_to_f32, f32_to_f16>(dst, src, count); return;
    case DType::bf16: add16<bf16_to_f32, f32_to_bf16>(dst, src, count); return;
  }
  throw InvalidArgument("sum_into: unknown dtype value " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace commsched
