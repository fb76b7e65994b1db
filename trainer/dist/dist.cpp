// c10d's Gloo backend is declared only when USE_C10D_GLOO is defined; the wheel's libtorch_cpu.so carries it.
#define USE_C10D_GLOO 1

#include "dist/dist.h"

#include <ATen/ops/empty.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <boost/program_options.hpp>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <mutex>
#include <optional>

#include "dist/nccl_backend.h"

namespace po = boost::program_options;

namespace melforge::trainer {

namespace {

/// The value of environment variable `name` as an int, or `fallback` when it is unset or empty.
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || errno != 0 || x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
    throw InvalidArgument(std::string("environment variable ") + name + "='" + v + "' is not an integer");
  return static_cast<int>(x);
}

/// The first set variable of `names` as an int, else `fallback`.
int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* n : names) {
    const char* v = std::getenv(n);
    if (v != nullptr && *v != '\0') return env_int(n, fallback);
  }
  return fallback;
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

bool is_loopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0; }

std::string reason(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

/// Checks the rank and the local rank of `r` against its world size (InvalidArgument naming their sources).
void check_ranks(const DistOptions& r) {
  if (r.rank < 0 || r.rank >= r.world_size)
    throw InvalidArgument("the rank (--rank, RANK or SLURM_PROCID) must be in [0, " + std::to_string(r.world_size) +
                          "), got " + std::to_string(r.rank));
  if (r.local_rank < 0)
    throw InvalidArgument("the local rank (--local-rank, LOCAL_RANK or SLURM_LOCALID) must be >= 0, got " +
                          std::to_string(r.local_rank));
}

}  // namespace

CudaDeviceChoice choose_cuda_device(int local_rank, int device_count,
                                    const std::optional<std::string>& visible_devices) {
  const std::string visible =
      visible_devices ? "CUDA_VISIBLE_DEVICES='" + *visible_devices + "'" : "CUDA_VISIBLE_DEVICES unset";
  if (local_rank < 0) throw InvalidArgument("local rank must be >= 0, got " + std::to_string(local_rank));
  if (device_count < 1)
    throw InvalidArgument("local rank " + std::to_string(local_rank) + ": this process sees no CUDA device (" +
                          visible + ")");
  CudaDeviceChoice c;
  c.ordinal = local_rank % device_count;
  c.description = "local rank " + std::to_string(local_rank) + " -> cuda:" + std::to_string(c.ordinal) + " (" +
                  std::to_string(local_rank) + " % " + std::to_string(device_count) + " visible device" +
                  (device_count == 1 ? "" : "s") + "; " + visible + ")";
  return c;
}

void DistOptions::validate() const {
  if (backend != "auto" && backend != "gloo" && backend != "nccl")
    throw InvalidArgument("--dist-backend must be auto, gloo or nccl, got '" + backend + "'");
  if (rank < -1) throw InvalidArgument("--rank must be >= 0, got " + std::to_string(rank));
  if (world_size < 0) throw InvalidArgument("--world-size must be >= 1, got " + std::to_string(world_size));
  if (local_rank < -1) throw InvalidArgument("--local-rank must be >= 0, got " + std::to_string(local_rank));
  if (master_port < 0 || master_port > 65535)
    throw InvalidArgument("--master-port must be in [1, 65535], got " + std::to_string(master_port));
  if (!(timeout > 0) || !std::isfinite(timeout))
    throw InvalidArgument("--dist-timeout must be a positive number of seconds, got " + std::to_string(timeout));
  if (!(bucket_mib > 0) || !std::isfinite(bucket_mib))
    throw InvalidArgument("--bucket-mib must be > 0, got " + std::to_string(bucket_mib));
}

DistOptions DistOptions::resolve() const {
  validate();
  DistOptions r = *this;
  if (r.world_size == 0) r.world_size = env_int({"WORLD_SIZE", "SLURM_NTASKS"}, 1);
  if (r.rank == -1) r.rank = env_int({"RANK", "SLURM_PROCID"}, 0);
  if (r.local_rank == -1) r.local_rank = env_int({"LOCAL_RANK", "SLURM_LOCALID"}, 0);
  if (r.master_addr.empty()) {
    const char* a = std::getenv("MASTER_ADDR");
    r.master_addr = a != nullptr && *a != '\0' ? a : "127.0.0.1";
  }
  if (r.world_size < 1)
    throw InvalidArgument("the world size (--world-size, WORLD_SIZE or SLURM_NTASKS) must be >= 1, got " +
                          std::to_string(r.world_size));
  if (r.master_port == 0) r.master_port = env_int("MASTER_PORT", r.world_size == 1 ? 0 : 29500);
  check_ranks(r);
  const bool free_port = r.world_size == 1 && r.master_port == 0;
  if (!free_port && (r.master_port < 1 || r.master_port > 65535))
    throw InvalidArgument("the master port (--master-port or MASTER_PORT) must be in [1, 65535], got " +
                          std::to_string(r.master_port));
  return r;
}

void add_options(po::options_description& desc, DistOptions& o) {
  desc.add_options()("dist-backend", po::value(&o.backend)->default_value(o.backend)->value_name("auto|gloo|nccl"),
                     "data-parallel backend (auto: NCCL on CUDA, Gloo on the CPU); gloo or nccl given: through c10d even alone")(
      "rank", po::value(&o.rank)->value_name("R"), "this process's rank (default: RANK, SLURM_PROCID, else 0)")(
      "world-size", po::value(&o.world_size)->value_name("N"),
      "processes in the data-parallel job (default: WORLD_SIZE, SLURM_NTASKS, else 1); 1 given: through c10d")(
      "local-rank", po::value(&o.local_rank)->value_name("R"),
      "rank on this machine; CUDA device: local rank % visible devices (default: LOCAL_RANK, SLURM_LOCALID, else 0)")(
      "master-addr", po::value(&o.master_addr)->value_name("HOST"),
      "host of rank 0's TCPStore (default: MASTER_ADDR, else 127.0.0.1)")(
      "master-port", po::value(&o.master_port)->value_name("PORT"),
      "port of rank 0's TCPStore (default: MASTER_PORT, else 29500; a free one for a single process)")(
      "dist-timeout", po::value(&o.timeout)->default_value(o.timeout)->value_name("S"),
      "seconds the rendezvous or a collective waits for the other ranks before failing")(
      "bucket-mib", po::value(&o.bucket_mib)->default_value(o.bucket_mib)->value_name("MiB"),
      "gradient bytes per all-reduce bucket")(
      "no-overlap", po::bool_switch()->notifier([&o](bool off) { o.overlap = !off; }),
      "all-reduce the gradients after the backward pass instead of during it")(
      "sync-bn", po::bool_switch(&o.sync_bn),
      "batch norms normalise with the statistics of the global batch, all ranks (SyncBatchNorm; one more all-reduce "
      "per batch norm layer)");
}

// ---------------------------------------------------------------------------------------------------------------

struct ProcessGroup::Impl {
  int rank = 0, size = 1, port = 0;
  std::string backend_name;
  double timeout_s = 0;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;

  /// Runs `f`, turning c10d's exceptions into a DistError that names this rank and `op`.
  template <typename F>
  auto guarded(const std::string& op, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw DistError("rank " + std::to_string(rank) + " of " + std::to_string(size) + ": " + op + " failed (" +
                      backend_name + ", --dist-timeout " + seconds_text(timeout_s) +
                      " s): another rank died, hung or cannot be reached: " + reason(e));
    }
  }

  /// Waits for `work`, as guarded() reports failures.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& op) {
    guarded(op, [&] { work->wait(); });
  }
};

ProcessGroup::ProcessGroup(const DistOptions& o, at::Device device) : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.rank = o.rank;
  d.size = o.world_size;
  d.timeout_s = o.timeout;
  d.backend_name = o.backend == "auto" ? (device.is_cuda() ? "nccl" : "gloo") : o.backend;
  if (d.backend_name == "nccl" && !device.is_cuda())
    throw InvalidArgument("--dist-backend nccl needs a CUDA device (use gloo on the CPU)");
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout * 1000));
  d.guarded("the rendezvous at " + o.master_addr + ":" + std::to_string(o.master_port), [&] {
    const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
    const bool agent_store = agent != nullptr && std::string(agent) == "True";
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(o.master_port);
    so.isServer = o.rank == 0 && !agent_store;
    so.numWorkers = static_cast<std::size_t>(o.world_size);
    so.waitWorkers = true;
    so.timeout = timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
    d.port = tcp->getPort();
    d.store = tcp;
    if (agent_store) {
      const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
      d.store = c10::make_intrusive<c10d::PrefixStore>(
          std::string("/worker/attempt_") + (attempt != nullptr ? attempt : "0"), d.store);
    }
  });
  d.guarded("connecting the " + d.backend_name + " process group", [&] {
    if (d.backend_name == "nccl") {
      d.backend = make_nccl_backend(d.store, o.rank, o.world_size, timeout);
      return;
    }
    auto go = c10d::ProcessGroupGloo::Options::create(timeout);
    const char* iface = std::getenv("GLOO_SOCKET_IFNAME");
    if (iface != nullptr && *iface != '\0')
      go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(iface));
    else if (is_loopback(o.master_addr))
      go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    else
      go->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    d.backend = c10::make_intrusive<c10d::ProcessGroupGloo>(d.store, o.rank, o.world_size, go);
  });
}

ProcessGroup::~ProcessGroup() = default;

int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::size() const { return impl_->size; }
const std::string& ProcessGroup::backend() const { return impl_->backend_name; }
int ProcessGroup::port() const { return impl_->port; }

void ProcessGroup::broadcast(std::vector<at::Tensor>& tensors, int root) {
  for (at::Tensor& t : tensors) {
    std::vector<at::Tensor> one{t.is_contiguous() ? t : t.contiguous()};
    c10d::BroadcastOptions bo;
    bo.rootRank = root;
    impl_->wait(impl_->guarded("broadcast", [&] { return impl_->backend->broadcast(one, bo); }), "broadcast");
    if (!one[0].is_same(t)) t.copy_(one[0]);
  }
}

void ProcessGroup::allreduce_sum(std::vector<at::Tensor>& tensors) {
  for (at::Tensor& t : tensors) {
    std::vector<at::Tensor> one{t.is_contiguous() ? t : t.contiguous()};
    impl_->wait(impl_->guarded("all-reduce", [&] { return impl_->backend->allreduce(one); }), "all-reduce");
    if (!one[0].is_same(t)) t.copy_(one[0]);
  }
}

std::vector<std::string> ProcessGroup::gather_bytes(const std::string& key, const std::string& bytes) {
  Impl& d = *impl_;
  const auto name = [&](int r) { return "melforge/" + key + "/" + std::to_string(r); };
  std::vector<std::string> out;
  d.guarded("gathering '" + key + "' through the store", [&] {
    d.store->set(name(d.rank), std::vector<uint8_t>(bytes.begin(), bytes.end()));
    if (d.rank != 0) return;
    for (int r = 0; r < d.size; ++r) {
      const std::vector<uint8_t> v = d.store->get(name(r));
      out.emplace_back(v.begin(), v.end());
      d.store->deleteKey(name(r));
    }
  });
  return out;
}

// ---------------------------------------------------------------------------------------------------------------

struct GradientSync::State {
  struct Bucket {
    at::Tensor flat;                  // the bucket's gradients, 1-d
    std::vector<std::size_t> params;  // indices into `params`
    int64_t pending = 0;              // gradients still to arrive in this backward (overlap)
    c10::intrusive_ptr<c10d::Work> work;
  };
  ProcessGroup::Impl* group = nullptr;
  std::vector<at::Tensor> params;
  std::vector<std::size_t> bucket_of;  // per parameter
  std::vector<int64_t> offset_of;      // per parameter, elements into its bucket
  std::vector<unsigned> hooks;
  std::vector<char> arrived;           // per parameter, this backward (overlap)
  std::vector<Bucket> buckets;
  bool overlap = false, armed = false;
  std::mutex mutex;

  at::Tensor slice(std::size_t i) {
    const at::Tensor& p = params[i];
    return buckets[bucket_of[i]].flat.narrow(0, offset_of[i], p.numel());
  }

  void launch(Bucket& b) {
    std::vector<at::Tensor> one{b.flat};
    b.work = group->guarded("the gradient all-reduce", [&] { return group->backend->allreduce(one); });
  }

  /// The hook of parameter `i`: `grad` is what backward adds to its .grad.
  void on_grad(std::size_t i, const at::Tensor& grad) {
    std::lock_guard lock(mutex);
    if (!armed || arrived[i]) return;
    arrived[i] = 1;
    const at::Tensor& g = params[i].grad();
    at::Tensor dst = slice(i);
    if (g.defined())
      dst.copy_((g + grad).reshape(-1));
    else
      dst.copy_(grad.reshape(-1));
    Bucket& b = buckets[bucket_of[i]];
    if (--b.pending == 0) launch(b);
  }
};

GradientSync::GradientSync(ProcessGroup& group, std::vector<at::Tensor> params, double bucket_mib, bool overlap)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.group = &group.impl();
  s.params = std::move(params);
  s.overlap = overlap;
  s.bucket_of.assign(s.params.size(), 0);
  s.offset_of.assign(s.params.size(), 0);
  s.arrived.assign(s.params.size(), 0);
  const auto cap = static_cast<int64_t>(bucket_mib * (1 << 20));
  std::vector<int64_t> sizes;
  for (std::size_t k = s.params.size(); k-- > 0;) {
    const at::Tensor& p = s.params[k];
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    const bool fits = !s.buckets.empty() && sizes.back() + bytes <= cap &&
                      s.params[s.buckets.back().params.front()].scalar_type() == p.scalar_type() &&
                      s.params[s.buckets.back().params.front()].device() == p.device();
    if (!fits) {
      s.buckets.emplace_back();
      sizes.push_back(0);
    }
    State::Bucket& b = s.buckets.back();
    s.bucket_of[k] = s.buckets.size() - 1;
    s.offset_of[k] = b.params.empty() ? 0 : s.offset_of[b.params.back()] + s.params[b.params.back()].numel();
    b.params.push_back(k);
    sizes.back() += bytes;
  }
  for (State::Bucket& b : s.buckets) {
    const at::Tensor& last = s.params[b.params.back()];
    const int64_t n = s.offset_of[b.params.back()] + last.numel();
    b.flat = at::empty({n}, last.options());
  }
  if (!overlap) return;
  const std::weak_ptr<State> weak = state_;
  for (std::size_t i = 0; i < s.params.size(); ++i)
    s.hooks.push_back(s.params[i].register_hook([weak, i](const at::Tensor& grad) {
      if (auto st = weak.lock()) st->on_grad(i, grad);
    }));
}

GradientSync::~GradientSync() {
  for (std::size_t i = 0; i < state_->hooks.size(); ++i) state_->params[i].remove_hook(state_->hooks[i]);
}

int64_t GradientSync::buckets() const { return static_cast<int64_t>(state_->buckets.size()); }

void GradientSync::prepare() {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  s.armed = s.overlap;
  std::fill(s.arrived.begin(), s.arrived.end(), 0);
  for (State::Bucket& b : s.buckets) {
    b.pending = static_cast<int64_t>(b.params.size());
    b.work.reset();
  }
}

void GradientSync::finish() {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  s.armed = false;
  for (State::Bucket& b : s.buckets) {
    if (b.work) continue;
    for (const std::size_t i : b.params) {
      if (s.arrived[i]) continue;
      const at::Tensor& g = s.params[i].grad();
      if (g.defined())
        s.slice(i).copy_(g.reshape(-1));
      else
        s.slice(i).zero_();
    }
    s.launch(b);
  }
  const double world = s.group->size;
  for (State::Bucket& b : s.buckets) {
    s.group->wait(b.work, "the gradient all-reduce");
    b.work.reset();
    b.flat.div_(world);
  }
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    at::Tensor& g = s.params[i].mutable_grad();
    const at::Tensor avg = s.slice(i).view(s.params[i].sizes());
    if (g.defined())
      g.copy_(avg);
    else
      g = avg.clone();
  }
}

}  // namespace melforge::trainer
