#include "core/kernels.hpp"

namespace ad::kernels {

namespace {
template <class T> AD_VEC void add_n(T* __restrict a, const T* __restrict b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) a[i] += b[i];
}
}  // namespace

void add_into(Tensor& acc, const Tensor& v) {
  if (!(acc.shape() == v.shape()) || acc.dtype() != v.dtype())
    throw Error(fmt::format("add_into: {}{} += {}{}", dtype_name(acc.dtype()), acc.shape().str(), dtype_name(v.dtype()),
                            v.shape().str()));
  dispatch_float(acc.dtype(), "add_into", [&](auto t) {
    using T = decltype(t);
    add_n(acc.data<T>(), v.data<T>(), acc.numel());
  });
}

}  // namespace ad::kernels
