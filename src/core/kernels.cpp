#include "core/kernels.hpp"

namespace ad::kernels {

void add_into(Tensor& acc, const Tensor& v) {
  if (!(acc.shape() == v.shape()) || acc.dtype() != v.dtype())
    throw Error(fmt::format("add_into: {}{} += {}{}", dtype_name(acc.dtype()), acc.shape().str(), dtype_name(v.dtype()),
                            v.shape().str()));
  dispatch_float(acc.dtype(), "add_into", [&](auto t) {
    using T = decltype(t);
    T* a = acc.data<T>();
    const T* b = v.data<T>();
    const std::int64_t n = acc.numel();  // hoisted: numel() in the condition kept the loop scalar
    for (std::int64_t i = 0; i < n; ++i) a[i] += b[i];
  });
}

}  // namespace ad::kernels
