// safetensors: writer (streamed, atomic) and strict validating reader.
#include "ad/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <numeric>
#include <set>
#include <string_view>

#include "io/json.hpp"

namespace ad {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swaps here");

const Tensor* SafeTensors::find(const std::string& name) const {
  for (const auto& nt : tensors)
    if (nt.first == name) return &nt.second;
  return nullptr;
}
const Tensor& SafeTensors::at(const std::string& name) const {
  const Tensor* t = find(name);
  if (!t) throw Error(fmt::format("safetensors: no tensor named {}", json::quote(name)));
  return *t;
}

namespace {

constexpr const char* kMetaKey = "__metadata__";

const char* st_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i64: return "I64";
  }
  return "?";
}
bool st_dtype_from(const std::string& s, DType& t) {
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64})
    if (s == st_dtype_name(d)) { t = d; return true; }
  return false;
}

// ---- writer ----

struct Layout {
  std::string header;              // JSON, padded with spaces to a multiple of 8 with the length prefix
  std::vector<std::size_t> order;  // tensors in data order
  std::uint64_t data_bytes = 0;
};

Layout layout(const NamedTensors& tensors, const Metadata& metadata) {
  std::set<std::string_view> seen;
  for (const auto& nt : tensors) {
    const std::string& n = nt.first;
    if (n.empty()) throw Error("save_safetensors: a tensor has an empty name");
    if (n == kMetaKey) throw Error("save_safetensors: the name \"__metadata__\" is reserved for metadata");
    if (!json::valid_utf8(n)) throw Error(fmt::format("save_safetensors: tensor name {} is not valid UTF-8", json::quote(n)));
    if (!seen.insert(n).second) throw Error(fmt::format("save_safetensors: tensor name {} appears twice", json::quote(n)));
    if (!nt.second.defined()) throw Error(fmt::format("save_safetensors: tensor {} is undefined", json::quote(n)));
    if (!(nt.second.device() == Device::cpu()))
      throw Error(fmt::format("save_safetensors: tensor {} is not on the CPU", json::quote(n)));
  }
  for (const auto& kv : metadata)
    if (!json::valid_utf8(kv.first) || !json::valid_utf8(kv.second))
      throw Error(fmt::format("save_safetensors: metadata entry {} is not valid UTF-8", json::quote(kv.first)));

  Layout l;
  l.order.resize(tensors.size());
  std::iota(l.order.begin(), l.order.end(), std::size_t{0});
  // larger elements first, so every tensor's data is aligned to its element size
  std::stable_sort(l.order.begin(), l.order.end(), [&](std::size_t a, std::size_t b) {
    return dtype_size(tensors[a].second.dtype()) > dtype_size(tensors[b].second.dtype());
  });
  std::string h = "{";
  if (!metadata.empty()) {
    h += json::quote(kMetaKey) + ":{";
    bool first = true;
    for (const auto& kv : metadata) {
      if (!first) h += ',';
      first = false;
      h += json::quote(kv.first) + ':' + json::quote(kv.second);
    }
    h += '}';
  }
  for (std::size_t i : l.order) {
    const Tensor& t = tensors[i].second;
    std::uint64_t begin = l.data_bytes, end = begin + t.nbytes();
    if (h.size() > 1) h += ',';
    h += fmt::format("{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", json::quote(tensors[i].first),
                     st_dtype_name(t.dtype()), fmt::join(t.shape().vec(), ","), begin, end);
    l.data_bytes = end;
  }
  h += '}';
  while ((h.size() + 8) % 8 != 0) h += ' ';
  std::string prefix(8, '\0');
  for (int k = 0; k < 8; ++k) prefix[static_cast<std::size_t>(k)] = static_cast<char>((h.size() >> (8 * k)) & 0xFF);
  l.header = prefix + h;
  return l;
}

class File {
 public:
  File() = default;
  explicit File(int fd) : fd_(fd) {}
  ~File() { close(); }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  int fd() const { return fd_; }
  void reset(int fd) {
    close();
    fd_ = fd;
  }
  int close() {
    int r = 0;
    if (fd_ >= 0) r = ::close(fd_);
    fd_ = -1;
    return r;
  }

 private:
  int fd_ = -1;
};

std::string sys_error(const std::string& what, const std::string& path) {
  return fmt::format("{}: {}: {}", what, path, std::strerror(errno));
}

void write_all(int fd, const void* p, std::size_t n, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, std::min<std::size_t>(n, std::size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw Error(sys_error("save_safetensors: write failed", path));
    c += w;
    n -= static_cast<std::size_t>(w);
  }
}

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// The file a save to `path` replaces: `path`, or where its chain of symbolic
// links ends (a "latest -> step_N" link keeps pointing at the new contents,
// rather than being replaced by a file). A dangling link's target is created.
std::string link_target(const std::string& path) {
  std::string target = path;
  for (int hop = 0; hop < 40; ++hop) {
    struct stat st {};
    if (::lstat(target.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return target;
    std::string link(static_cast<std::size_t>(st.st_size > 0 ? st.st_size : 4096) + 1, '\0');
    ssize_t n = ::readlink(target.c_str(), link.data(), link.size());
    if (n < 0 || static_cast<std::size_t>(n) >= link.size())
      throw Error(sys_error("save_safetensors: cannot read the symbolic link", target));
    link.resize(static_cast<std::size_t>(n));
    target = !link.empty() && link[0] == '/' ? link : parent_dir(target) + "/" + link;
  }
  throw Error(fmt::format("save_safetensors: too many levels of symbolic links at \"{}\"", path));
}

// The temporary file's name less its ".tmp-<pid>-<stamp>" (at most 30
// characters): the target's, its file name cut to 200 bytes so that the
// whole stays within a file name's 255 (a target named 240 bytes long is
// valid; its temporary name must be too).
std::string temp_stem(const std::string& target) {
  constexpr std::size_t kMaxStem = 200;
  const std::size_t slash = target.find_last_of('/');
  const std::size_t base = slash == std::string::npos ? 0 : slash + 1;
  if (target.size() - base <= kMaxStem) return target;
  return target.substr(0, base + kMaxStem);
}

// ---- reader ----

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  std::uint64_t begin, end;
};

std::uint64_t read_u64_le(const unsigned char* b) {
  std::uint64_t v = 0;
  for (int k = 7; k >= 0; --k) v = (v << 8) | b[k];
  return v;
}

// Validates the header length against the limit and the source's size.
void check_header_len(std::uint64_t n, std::uint64_t size, const std::string& what) {
  if (size < 8) throw Error(fmt::format("{}: {} bytes, too short to hold the 8-byte header length (truncated?)", what, size));
  if (n > kSafetensorsMaxHeader)
    throw Error(fmt::format("{}: header length {} exceeds the limit of {} bytes", what, n, kSafetensorsMaxHeader));
  if (n > size - 8)
    throw Error(fmt::format("{}: header length {} runs past the end of the data ({} bytes after the length; truncated?)",
                            what, n, size - 8));
  if (n < 2) throw Error(fmt::format("{}: header length {} is too short for a JSON object", what, n));
}

std::vector<Entry> parse_header(std::string_view text, std::uint64_t data_size, Metadata& metadata, const std::string& what) {
  const std::string hw = what + ": header";
  if (text[0] != '{') throw Error(fmt::format("{}: header does not start with '{{'", what));
  json::Value root = json::parse(text, hw);
  if (root.kind != json::Value::Kind::object) throw Error(fmt::format("{} is not a JSON object", hw));
  std::vector<Entry> entries;
  for (const auto& m : root.members) {
    const std::string qn = json::quote(m.first);
    const json::Value& v = m.second;
    if (m.first == kMetaKey) {
      if (v.kind != json::Value::Kind::object)
        throw Error(fmt::format("{}: \"__metadata__\" is {}, not an object of strings", hw, json::kind_name(v.kind)));
      for (const auto& kv : v.members) {
        if (kv.second.kind != json::Value::Kind::string)
          throw Error(fmt::format("{}: \"__metadata__\" value for key {} is {}, not a string", hw, json::quote(kv.first),
                                  json::kind_name(kv.second.kind)));
        metadata[kv.first] = kv.second.text;
      }
      continue;
    }
    if (v.kind != json::Value::Kind::object)
      throw Error(fmt::format("{}: tensor {} is {}, not an object", hw, qn, json::kind_name(v.kind)));
    const json::Value *dt = nullptr, *sh = nullptr, *off = nullptr;
    for (const auto& f : v.members) {
      if (f.first == "dtype") dt = &f.second;
      else if (f.first == "shape") sh = &f.second;
      else if (f.first == "data_offsets") off = &f.second;
      else throw Error(fmt::format("{}: tensor {} has an unknown field {}", hw, qn, json::quote(f.first)));
    }
    if (!dt || !sh || !off)
      throw Error(fmt::format("{}: tensor {} lacks \"{}\"", hw, qn, !dt ? "dtype" : !sh ? "shape" : "data_offsets"));
    Entry e;
    e.name = m.first;
    if (dt->kind != json::Value::Kind::string)
      throw Error(fmt::format("{}: tensor {}: dtype is {}, not a string", hw, qn, json::kind_name(dt->kind)));
    if (!st_dtype_from(dt->text, e.dtype))
      throw Error(fmt::format("{}: tensor {}: unsupported dtype {} (ad reads F32, F64, F16, BF16, I64)", hw, qn,
                              json::quote(dt->text)));
    if (sh->kind != json::Value::Kind::array)
      throw Error(fmt::format("{}: tensor {}: shape is {}, not an array", hw, qn, json::kind_name(sh->kind)));
    if (sh->items.size() > static_cast<std::size_t>(kMaxRank))
      throw Error(fmt::format("{}: tensor {}: shape has rank {}, more than ad's maximum {}", hw, qn, sh->items.size(), kMaxRank));
    std::uint64_t numel = 1;
    bool overflow = false;
    for (const auto& d : sh->items) {
      std::uint64_t dim = 0;
      if (!json::to_u64(d, dim) || dim > static_cast<std::uint64_t>(INT64_MAX))
        throw Error(fmt::format("{}: tensor {}: shape entry {} is not a non-negative 64-bit integer", hw, qn,
                                d.kind == json::Value::Kind::number ? d.text : json::kind_name(d.kind)));
      e.shape.push_back(static_cast<std::int64_t>(dim));
      overflow = overflow || __builtin_mul_overflow(numel, dim, &numel);
    }
    std::uint64_t nbytes = 0;
    if (overflow || numel > static_cast<std::uint64_t>(INT64_MAX) ||
        __builtin_mul_overflow(numel, static_cast<std::uint64_t>(dtype_size(e.dtype)), &nbytes))
      throw Error(fmt::format("{}: tensor {}: shape {} has more elements than 64 bits can count", hw, qn, e.shape.str()));
    if (off->kind != json::Value::Kind::array || off->items.size() != 2 || !json::to_u64(off->items[0], e.begin) ||
        !json::to_u64(off->items[1], e.end))
      throw Error(fmt::format("{}: tensor {}: data_offsets must be [begin, end], two non-negative 64-bit integers", hw, qn));
    if (e.begin > e.end)
      throw Error(fmt::format("{}: tensor {}: data_offsets [{}, {}] end before they begin", hw, qn, e.begin, e.end));
    if (e.end > data_size)
      throw Error(fmt::format("{}: tensor {}: data_offsets [{}, {}] run past the end of the data section ({} bytes; "
                              "truncated?)", what, qn, e.begin, e.end, data_size));
    if (e.end - e.begin != nbytes)
      throw Error(fmt::format("{}: tensor {}: data_offsets [{}, {}] hold {} bytes, but {}{} needs {}", what, qn, e.begin,
                              e.end, e.end - e.begin, dt->text, e.shape.str(), nbytes));
    entries.push_back(std::move(e));
  }
  // The tensors must tile the data section: no overlap, no gap, nothing after.
  std::vector<const Entry*> by_offset;
  for (const auto& e : entries) by_offset.push_back(&e);
  std::stable_sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t at = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : by_offset) {
    if (e->begin < at)
      throw Error(fmt::format("{}: tensors {} [{}, {}] and {} [{}, {}] overlap", what, json::quote(prev->name), prev->begin,
                              prev->end, json::quote(e->name), e->begin, e->end));
    if (e->begin > at)
      throw Error(fmt::format("{}: bytes [{}, {}) of the data section belong to no tensor (data_offsets must be "
                              "contiguous)", what, at, e->begin));
    at = e->end;
    prev = e;
  }
  if (at != data_size)
    throw Error(fmt::format("{}: the data section has {} bytes but the tensors cover {} (trailing bytes)", what, data_size, at));
  return entries;
}

}  // namespace

std::vector<std::uint8_t> serialize_safetensors(const NamedTensors& tensors, const Metadata& metadata) {
  Layout l = layout(tensors, metadata);
  std::vector<std::uint8_t> out(l.header.size() + l.data_bytes);
  std::memcpy(out.data(), l.header.data(), l.header.size());
  std::size_t at = l.header.size();
  for (std::size_t i : l.order) {
    const Tensor& t = tensors[i].second;
    if (t.nbytes()) std::memcpy(out.data() + at, t.raw(), t.nbytes());
    at += t.nbytes();
  }
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  Layout l = layout(tensors, metadata);  // all validation before the disk is touched
  const std::string target = link_target(path);
  struct stat old {};
  const bool existed = ::stat(target.c_str(), &old) == 0;
  std::string tmp;
  File f;
  auto stamp = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  for (int attempt = 0; f.fd() < 0; ++attempt) {
    tmp = fmt::format("{}.tmp-{}-{:x}", temp_stem(target), static_cast<long>(::getpid()),
                      stamp + static_cast<std::uint64_t>(attempt));
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, existed ? 0600 : 0666);
    if (fd >= 0) f.reset(fd);
    else if (errno != EEXIST || attempt > 100) throw Error(sys_error("save_safetensors: cannot create a temporary file next to", target));
  }
  try {
    // a file replaced keeps its permission bits (a private checkpoint stays private)
    if (existed && ::fchmod(f.fd(), old.st_mode & 07777) != 0)
      throw Error(sys_error("save_safetensors: cannot set the permissions of the temporary file for", target));
    write_all(f.fd(), l.header.data(), l.header.size(), path);
    for (std::size_t i : l.order) {
      const Tensor& t = tensors[i].second;
      write_all(f.fd(), t.raw(), t.nbytes(), path);
    }
    if (::fsync(f.fd()) != 0) throw Error(sys_error("save_safetensors: fsync failed", path));
    if (f.close() != 0) throw Error(sys_error("save_safetensors: close failed", path));
    if (::rename(tmp.c_str(), target.c_str()) != 0)
      throw Error(sys_error("save_safetensors: cannot rename the temporary file to", target));
  } catch (...) {
    f.close();
    ::unlink(tmp.c_str());
    throw;
  }
  // make the rename durable (best effort: some filesystems refuse to fsync a directory)
  int dfd = ::open(parent_dir(target).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

SafeTensors parse_safetensors(const void* data, std::size_t size) {
  const std::string what = "safetensors (in memory)";
  const auto* b = static_cast<const unsigned char*>(data);
  std::uint64_t n = size >= 8 ? read_u64_le(b) : 0;
  check_header_len(n, size, what);
  SafeTensors st;
  std::string_view text(reinterpret_cast<const char*>(b + 8), static_cast<std::size_t>(n));
  std::uint64_t data_size = size - 8 - n;
  std::vector<Entry> entries = parse_header(text, data_size, st.metadata, what);
  const unsigned char* base = b + 8 + n;
  for (auto& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (t.nbytes()) std::memcpy(t.raw(), base + e.begin, t.nbytes());
    st.tensors.emplace_back(std::move(e.name), std::move(t));
  }
  return st;
}

SafeTensors load_safetensors(const std::string& path) {
  const std::string what = "load_safetensors: " + path;
  // O_NONBLOCK: opening a FIFO would wait for a writer (it has no effect on a regular file's reads)
  File f(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (f.fd() < 0) throw Error(sys_error("load_safetensors: cannot open", path));
  struct stat sb {};
  if (::fstat(f.fd(), &sb) != 0) throw Error(sys_error("load_safetensors: cannot stat", path));
  if (!S_ISREG(sb.st_mode)) throw Error(fmt::format("{}: not a regular file", what));
  auto size = static_cast<std::uint64_t>(sb.st_size);
  auto read_at = [&](void* p, std::uint64_t n, std::uint64_t off) {
    auto* c = static_cast<char*>(p);
    while (n > 0) {
      ssize_t r = ::pread(f.fd(), c, std::min<std::uint64_t>(n, std::uint64_t{1} << 30), static_cast<off_t>(off));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw Error(sys_error("load_safetensors: read failed", path));
      if (r == 0) throw Error(fmt::format("{}: the file ended early (changed while reading?)", what));
      c += r;
      off += static_cast<std::uint64_t>(r);
      n -= static_cast<std::uint64_t>(r);
    }
  };
  unsigned char len[8] = {};
  if (size >= 8) read_at(len, 8, 0);
  std::uint64_t n = size >= 8 ? read_u64_le(len) : 0;
  check_header_len(n, size, what);
  std::string text(static_cast<std::size_t>(n), '\0');
  read_at(text.data(), n, 8);
  SafeTensors st;
  std::vector<Entry> entries = parse_header(text, size - 8 - n, st.metadata, what);
  for (auto& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    read_at(t.raw(), t.nbytes(), 8 + n + e.begin);
    st.tensors.emplace_back(std::move(e.name), std::move(t));
  }
  return st;
}

}  // namespace ad
