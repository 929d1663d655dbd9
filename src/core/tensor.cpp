#include "ad/tensor.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "core/device.hpp"
#include "core/load.hpp"

namespace ad {

namespace {
// v (element i) as an i64, or an ad::Error: [-2^63, 2^63) converts, outside it (and NaN) the conversion is undefined.
std::int64_t to_i64(double v, std::int64_t i) {
  if (!(v >= -9223372036854775808.0 && v < 9223372036854775808.0))
    throw Error(fmt::format("Tensor: {} (element {}) does not convert to i64: not finite or out of range", v, i));
  return static_cast<std::int64_t>(v);
}
// Stores f(i) for i < n into p, converted to dtype t.
template <class F> void visit_store(DType t, void* p, std::int64_t n, F&& f) {
  switch (t) {
    case DType::f32: { auto* q = static_cast<float*>(p); for (std::int64_t i = 0; i < n; ++i) q[i] = static_cast<float>(f(i)); break; }
    case DType::f64: { auto* q = static_cast<double*>(p); for (std::int64_t i = 0; i < n; ++i) q[i] = f(i); break; }
    case DType::f16: { auto* q = static_cast<std::uint16_t*>(p); for (std::int64_t i = 0; i < n; ++i) q[i] = f64_to_f16(static_cast<double>(f(i))); break; }
    case DType::bf16: { auto* q = static_cast<std::uint16_t*>(p); for (std::int64_t i = 0; i < n; ++i) q[i] = f64_to_bf16(static_cast<double>(f(i))); break; }
    case DType::i64: {
      auto* q = static_cast<std::int64_t*>(p);
      for (std::int64_t i = 0; i < n; ++i) q[i] = to_i64(f(i), i);
      break;
    }
  }
}
// The high 64 bits of the 128-bit product a b (in 32-bit pieces: no __int128 in ISO C++).
std::uint64_t mul_high(std::uint64_t a, std::uint64_t b) {
  const std::uint64_t al = a & 0xffffffffu, ah = a >> 32, bl = b & 0xffffffffu, bh = b >> 32;
  const std::uint64_t ll = al * bl, hl = ah * bl, lh = al * bh, hh = ah * bh;
  const std::uint64_t mid = (ll >> 32) + (hl & 0xffffffffu) + lh;  // < 2^64
  return hh + (hl >> 32) + (mid >> 32);
}
// randn / uniform draw floats: an integer dtype would silently truncate them
void check_float_draw(const char* what, DType t) {
  if (!is_floating(t))
    throw Error(fmt::format("Tensor::{}: dtype {} is not a float type (use Tensor::randint for integers)", what,
                            dtype_name(t)));
}
double load(DType t, const void* p, std::int64_t i) { return detail::load_as_double(t, p, i); }
// i64 -> f64 rounded to odd (truncated toward zero, last bit set when
// inexact), for an i64 going to f32, f16 or bf16: rounding it once more to
// nearest then gives the i64's own nearest value. Through the nearest f64
// (|v| > 2^53) a tie could form and round the wrong way: 2^60 + 2^36 + 1 came
// out 2^60 in f32, whose nearest is 2^60 + 2^37.
double i64_to_f64_odd(std::int64_t v) {
  const double d = static_cast<double>(v);
  double t;
  if (d >= 9223372036854775808.0) {  // rounded up to 2^63: truncation is the double below it
    t = 9223372036854774784.0;
  } else {
    const auto back = static_cast<std::int64_t>(d);
    if (back == v) return d;
    t = (v < 0 ? back < v : back > v) ? std::nextafter(d, 0.0) : d;  // rounded away from zero: one step back
  }
  std::uint64_t b;
  std::memcpy(&b, &t, sizeof b);
  b |= 1u;
  std::memcpy(&t, &b, sizeof t);
  return t;
}
void check_shape(const Shape& s, const char* what) {
  for (auto d : s)
    if (d < 0) throw Error(fmt::format("{}: negative dimension in shape {}", what, s.str()));
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, std::shared_ptr<Allocator> alloc) {
  check_shape(shape, "Tensor::empty");
  if (dtype_size(dtype) == 0) throw Error(fmt::format("Tensor::empty: invalid dtype (value {})", static_cast<int>(dtype)));
  if (!shape.fits_bytes(static_cast<std::int64_t>(dtype_size(dtype))))
    throw Error(fmt::format("Tensor::empty: shape {} of {} has more bytes than a 64-bit count holds", shape.str(),
                            dtype_name(dtype)));
  if (!alloc) alloc = default_allocator(device);
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ =
      std::make_shared<Storage>(std::move(alloc), static_cast<std::size_t>(shape.numel()) * dtype_size(dtype), device);
  return t;
}
Tensor Tensor::zeros(const Shape& shape, DType dtype) { return full(shape, 0.0, dtype); }
Tensor Tensor::ones(const Shape& shape, DType dtype) { return full(shape, 1.0, dtype); }
Tensor Tensor::full(const Shape& shape, double value, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.fill(value);
  return t;
}

template <class T> static Tensor from_span(std::span<const T> v, const Shape& shape) {
  check_shape(shape, "Tensor::from");
  if (static_cast<std::int64_t>(v.size()) != shape.numel())
    throw Error(fmt::format("Tensor::from: {} values do not fill shape {} ({} elements)", v.size(), shape.str(), shape.numel()));
  Tensor t = Tensor::empty(shape, DTypeOf<T>::value);
  if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * sizeof(T));
  return t;
}
Tensor Tensor::from(std::span<const float> v, const Shape& s) { return from_span(v, s); }
Tensor Tensor::from(std::span<const double> v, const Shape& s) { return from_span(v, s); }
Tensor Tensor::from(std::span<const std::int64_t> v, const Shape& s) { return from_span(v, s); }

Tensor Tensor::randn(const Shape& shape, Rng& rng, DType dtype, double mean, double stddev) {
  check_float_draw("randn", dtype);
  if (!std::isfinite(mean) || !(stddev >= 0) || !std::isfinite(stddev))
    throw Error(fmt::format("Tensor::randn: mean {} must be finite and stddev {} finite and >= 0 (shape {})", mean, stddev,
                            shape.str()));
  Tensor t = empty(shape, dtype);
  std::int64_t n = shape.numel();
  // Box-Muller on pairs: element i uses draws 2i and 2i+1 of the stream.
  std::uint64_t base = rng.reserve(2 * static_cast<std::uint64_t>(n));
  std::uint64_t seed = rng.seed();
  visit_store(dtype, t.raw(), n, [&](std::int64_t i) {
    auto k = base + 2 * static_cast<std::uint64_t>(i);
    double u1 = uniform01(philox_u32(seed, k)), u2 = uniform01(philox_u32(seed, k + 1));
    return mean + stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  });
  return t;
}
Tensor Tensor::uniform(const Shape& shape, Rng& rng, DType dtype, double lo, double hi) {
  check_float_draw("uniform", dtype);
  if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi)
    throw Error(fmt::format("Tensor::uniform: needs finite lo <= hi, got lo = {}, hi = {} (shape {})", lo, hi, shape.str()));
  Tensor t = empty(shape, dtype);
  std::int64_t n = shape.numel();
  std::uint64_t base = rng.reserve(static_cast<std::uint64_t>(n));
  visit_store(dtype, t.raw(), n, [&](std::int64_t i) {
    return lo + (hi - lo) * static_cast<double>(uniform01(philox_u32(rng.seed(), base + static_cast<std::uint64_t>(i))));
  });
  return t;
}
Tensor Tensor::randint(const Shape& shape, Rng& rng, std::int64_t n) {
  if (n <= 0) throw Error(fmt::format("Tensor::randint: n must be positive, got {}", n));
  Tensor t = empty(shape, DType::i64);
  const std::int64_t count = shape.numel();
  auto* q = t.data<std::int64_t>();
  const auto un = static_cast<std::uint64_t>(n);
  if (un <= (std::uint64_t(1) << 32)) {  // one 32-bit draw per element: floor(u n / 2^32)
    std::uint64_t base = rng.reserve(static_cast<std::uint64_t>(count));
    for (std::int64_t i = 0; i < count; ++i)
      q[i] = static_cast<std::int64_t>((philox_u32(rng.seed(), base + static_cast<std::uint64_t>(i)) * un) >> 32);
  } else {  // two draws per element, as one 64-bit u: floor(u n / 2^64)
    std::uint64_t base = rng.reserve(2 * static_cast<std::uint64_t>(count));
    for (std::int64_t i = 0; i < count; ++i) {
      const std::uint64_t k = base + 2 * static_cast<std::uint64_t>(i);
      const std::uint64_t u = (static_cast<std::uint64_t>(philox_u32(rng.seed(), k)) << 32) | philox_u32(rng.seed(), k + 1);
      q[i] = static_cast<std::int64_t>(mul_high(u, un));
    }
  }
  return t;
}

std::int64_t Tensor::dim(int i) const {
  int r = rank();
  if (i < -r || i >= r) throw Error(fmt::format("Tensor::dim: index {} out of range for shape {}", i, shape_.str()));
  return shape_[i < 0 ? i + r : i];
}
Device Tensor::device() const { return storage_ ? storage_->device() : Device::cpu(); }

void Tensor::check_type(DType t) const {
  if (!defined()) throw Error("Tensor: access to an undefined tensor");
  if (t != dtype_)
    throw Error(fmt::format("Tensor: data<{}>() on a {} tensor {}", dtype_name(t), dtype_name(dtype_), shape_.str()));
}

double Tensor::item() const {
  if (!defined()) throw Error("Tensor::item: undefined tensor");
  if (is_cuda()) return to(Device::cpu()).item();
  if (numel() != 1) throw Error(fmt::format("Tensor::item: tensor {} has {} elements, not 1", shape_.str(), numel()));
  return load(dtype_, raw(), 0);
}
std::vector<double> Tensor::to_vector() const {
  if (!defined()) throw Error("Tensor::to_vector: undefined tensor");
  if (is_cuda()) return to(Device::cpu()).to_vector();
  std::vector<double> v(static_cast<std::size_t>(numel()));
  for (std::int64_t i = 0; i < numel(); ++i) v[static_cast<std::size_t>(i)] = load(dtype_, raw(), i);
  return v;
}
double Tensor::at(std::initializer_list<std::int64_t> index) const {
  if (!defined()) throw Error("Tensor::at: undefined tensor");
  if (static_cast<int>(index.size()) != rank())
    throw Error(fmt::format("Tensor::at: {} indices for shape {}", index.size(), shape_.str()));
  std::int64_t flat = 0;
  int d = 0;
  for (auto i : index) {
    if (i < 0 || i >= shape_[d]) throw Error(fmt::format("Tensor::at: index {} out of range for dim {} of {}", i, d, shape_.str()));
    flat = flat * shape_[d] + i;
    ++d;
  }
  if (is_cuda()) {
    double v = 0;
    Tensor one = empty({}, dtype_);
    device::copy(one.raw(), Device::cpu(), static_cast<const char*>(raw()) + flat * static_cast<std::int64_t>(dtype_size(dtype_)),
                 device(), dtype_size(dtype_));
    v = one.item();
    return v;
  }
  return load(dtype_, raw(), flat);
}

Tensor Tensor::reshape(const Shape& shape) const {
  check_shape(shape, "Tensor::reshape");
  if (shape.numel() != numel())
    throw Error(fmt::format("Tensor::reshape: cannot view {} ({} elements) as {}", shape_.str(), numel(), shape.str()));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}
Tensor Tensor::view(std::int64_t offset, const Shape& shape) const {
  check_shape(shape, "Tensor::view");
  if (!defined()) throw Error("Tensor::view: undefined tensor");
  if (offset < 0 || offset > numel() || shape.numel() > numel() - offset)
    throw Error(fmt::format("Tensor::view: {} elements at offset {} do not fit in {}", shape.numel(), offset, shape_.str()));
  Tensor t = *this;
  t.shape_ = shape;
  t.offset_ = offset_ + static_cast<std::size_t>(offset) * dtype_size(dtype_);
  return t;
}
Tensor Tensor::rows(std::int64_t begin, std::int64_t count) const {
  if (!defined()) throw Error("Tensor::rows: undefined tensor");
  if (shape_.rank() == 0) throw Error("Tensor::rows: a scalar has no rows");
  if (begin < 0 || count < 0 || begin > shape_[0] || count > shape_[0] - begin)
    throw Error(fmt::format("Tensor::rows: rows [{}, {} + {}) are outside the {} rows of {}", begin, begin, count,
                            shape_[0], shape_.str()));
  std::int64_t row = 1;
  for (int d = 1; d < shape_.rank(); ++d) row *= shape_[d];
  Shape s = shape_;
  s[0] = count;
  return view(begin * row, s);
}
Tensor Tensor::clone(std::shared_ptr<Allocator> alloc) const {
  if (!defined()) return {};
  Tensor t = empty(shape_, dtype_, device(), std::move(alloc));
  device::copy(t.raw(), t.device(), raw(), device(), nbytes());
  return t;
}
Tensor Tensor::to(Device d) const {
  if (!defined()) throw Error("Tensor::to: undefined tensor");
  Tensor t = empty(shape_, dtype_, d);
  device::copy(t.raw(), d, raw(), device(), nbytes());
  return t;
}
Tensor Tensor::to(DType dtype) const {
  if (!defined()) throw Error("Tensor::to: undefined tensor");
  if (dtype == dtype_) return clone();
  Tensor t = empty(shape_, dtype, device());
  t.copy_from(*this);
  return t;
}
void Tensor::fill(double value) {
  if (!defined()) throw Error("Tensor::fill: undefined tensor");
  // an i64 tensor holds integers: 1.5 was truncated to 1 (not finite or out of range: visit_store's error)
  if (dtype_ == DType::i64 && std::isfinite(value) && value != std::trunc(value))
    throw Error(fmt::format("Tensor::fill: {} does not convert to i64: not an integer ({})", value, shape_.str()));
  mark_modified();
  if (is_cuda()) {
    Tensor h = empty(shape_, dtype_);
    h.fill(value);
    device::copy(raw(), device(), h.raw(), Device::cpu(), nbytes());
    return;
  }
  visit_store(dtype_, raw(), numel(), [&](std::int64_t) { return value; });
}
void Tensor::copy_from(const Tensor& src) {
  if (!defined() || !src.defined()) throw Error("Tensor::copy_from: undefined tensor");
  mark_modified();
  if (!(src.shape_ == shape_))
    throw Error(fmt::format("Tensor::copy_from: {}{} into {}{}", dtype_name(src.dtype_), src.shape_.str(),
                            dtype_name(dtype_), shape_.str()));
  if (src.dtype_ != dtype_) {
    if (is_cuda() || src.is_cuda()) {  // convert on the host
      Tensor h = src.to(Device::cpu()).to(dtype_);
      device::copy(raw(), device(), h.raw(), Device::cpu(), nbytes());
      return;
    }
    if (src.dtype_ == DType::i64 && dtype_ != DType::f64) {  // one rounding, not two (i64_to_f64_odd)
      const auto* q = static_cast<const std::int64_t*>(src.raw());
      visit_store(dtype_, raw(), numel(), [&](std::int64_t i) { return i64_to_f64_odd(q[i]); });
      return;
    }
    auto v = [&](std::int64_t i) { return load(src.dtype_, src.raw(), i); };
    if (dtype_ == DType::i64)  // every element first: a failed copy leaves this tensor as it was
      for (std::int64_t i = 0; i < numel(); ++i) (void)to_i64(v(i), i);
    visit_store(dtype_, raw(), numel(), v);
    return;
  }
  if (raw() != src.raw()) device::copy(raw(), device(), src.raw(), src.device(), nbytes());
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (!(a.shape() == b.shape()) || a.dtype() != b.dtype()) return false;
  if (a.is_cuda() || b.is_cuda()) return bitwise_equal(a.to(Device::cpu()), b.to(Device::cpu()));
  return a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace ad
