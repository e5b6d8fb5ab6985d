// The shared-memory collectives (layout and protocol in shm_comm.h).
#include "shm_comm.h"

#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TACIT_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define TACIT_CPU_RELAX() asm volatile("yield" ::: "memory")
#else
#define TACIT_CPU_RELAX() asm volatile("" ::: "memory")
#endif

// The sums are plain loops the compiler vectorises; on x86 with GCC each also gets AVX2 and
// AVX512 clones picked at load time (ifunc), so the module itself builds with plain -O3.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TACIT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TACIT_CLONES
#endif

namespace tacit_shm {
namespace {

const char* const kOpNames[] = {"?", "all_reduce", "all_gather", "reduce_scatter", "all_to_all"};

// ~1024 pauses is ~25-60 us on current x86 (a pause is 40-140 cycles): a peer that is running
// arrives well within that; past it, yield the core, since ranks may share cores with others.
constexpr uint64_t kPauseSpins = 1024;
constexpr double kCheckEvery_s = 1e-3;  // how often a waiting rank checks its peer is alive
constexpr double kSleepAfter_s = 1e-2;  // a wait this long is not a collective's latency: sleep

// The operation in progress on this thread, for error messages (send/recv run on their own
// threads beside the collectives).
thread_local const char* tl_what = "";

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bool have_proc() {
  static const bool yes = access("/proc/self/stat", R_OK) == 0;
  return yes;
}

// kill(pid, 0) alone says a zombie (exited, not yet reaped by its parent) is alive, and ranks
// are usually children of a launcher that reaps them late, so /proc/<pid>/stat's state decides.
bool pid_alive(int64_t pid) {
  if (pid <= 0) return true;
  if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return false;
  if (!have_proc()) return true;
  char path[64];
  snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return errno != ENOENT;
  char buf[512];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return true;
  buf[n] = 0;
  const char* p = strrchr(buf, ')');
  if (!p || !p[1] || !p[2]) return true;
  return p[2] != 'Z' && p[2] != 'X' && p[2] != 'x';
}

[[noreturn]] void fail(Ctx* c, const std::string& msg) {
  c->broken = true;
  c->error = msg;
  int32_t expected = -1;
  // Claim the abort slot (-2 while the message is written), so the other ranks stop waiting.
  if (c->hdr && c->hdr->abort_rank.compare_exchange_strong(expected, -2)) {
    snprintf(c->hdr->abort_msg, sizeof c->hdr->abort_msg, "%s", msg.c_str());
    c->hdr->abort_rank.store(c->rank, std::memory_order_release);
  }
  throw std::runtime_error(msg);
}

void enter(Ctx* c, const char* what) {
  if (c->broken) throw std::runtime_error("shm communicator unusable after an earlier failure: " + c->error);
  tl_what = what;
}

void check_peer(Ctx* c, int peer, double waited_s) {
  int32_t a = c->hdr->abort_rank.load(std::memory_order_acquire);
  if (a >= 0 && a != c->rank)
    fail(c, "shm communicator: rank " + std::to_string(a) + " failed (" + std::string(c->hdr->abort_msg) +
                "); rank " + std::to_string(c->rank) + " stops waiting in " + tl_what);
  int64_t pid = c->ctl[peer].pid;
  if (!pid_alive(pid))
    fail(c, "shm communicator: rank " + std::to_string(peer) + " (pid " + std::to_string(pid) +
                ") exited while rank " + std::to_string(c->rank) + " waited for it in " + tl_what);
  if (waited_s > c->timeout_s)
    fail(c, "shm communicator: rank " + std::to_string(c->rank) + " waited " + std::to_string((int)waited_s) +
                " s for rank " + std::to_string(peer) + " in " + tl_what + " (timeout_s " +
                std::to_string((int)c->timeout_s) + "): it is alive but not in the same collective");
}

// Until flag >= target; `peer` owns the flag. Never hangs: a dead peer, an abort by another
// rank or timeout_s raise (checked every ~1 ms once the first spins are over).
void wait_for(Ctx* c, const std::atomic<uint64_t>& flag, uint64_t target, int peer) {
  double start = 0, last = 0;
  for (uint64_t spins = 0;; ++spins) {
    if (flag.load(std::memory_order_acquire) >= target) return;
    if (spins < kPauseSpins) {
      TACIT_CPU_RELAX();
      continue;
    }
    double t = now_s();
    if (start == 0) start = last = t;
    if (t - last >= kCheckEvery_s) {
      last = t;
      check_peer(c, peer, t - start);
    }
    if (t - start > kSleepAfter_s) {
      timespec ts{0, 20000};
      nanosleep(&ts, nullptr);
    } else {
      sched_yield();
    }
  }
}

void publish(Ctx* c, uint64_t s, uint32_t op, int64_t nbytes, const int64_t* sizes) {
  Meta& m = c->ctl[c->rank].meta[s & 1];
  m.op = op;
  m.nbytes = nbytes;
  if (sizes) memcpy(m.sizes, sizes, sizeof(int64_t) * c->world);
  c->seq = s;
  c->ctl[c->rank].arrive.store(s, std::memory_order_release);
}

// Every peer's data for exchange s is in its slot; nbytes < 0 skips the size check.
void wait_all(Ctx* c, uint64_t s, uint32_t op, int64_t nbytes) {
  for (int p = 0; p < c->world; ++p) {
    if (p == c->rank) continue;
    wait_for(c, c->ctl[p].arrive, s, p);
    const Meta& m = c->ctl[p].meta[s & 1];
    if (m.op != op)
      fail(c, "shm communicator: rank " + std::to_string(c->rank) + " called " + kOpNames[op] + " while rank " +
                  std::to_string(p) + " called " + kOpNames[m.op < 5 ? m.op : 0] + ": collectives out of order");
    if (nbytes >= 0 && m.nbytes != nbytes)
      fail(c, "shm communicator: " + std::string(kOpNames[op]) + " of " + std::to_string(nbytes) +
                  " bytes on rank " + std::to_string(c->rank) + " but " + std::to_string(m.nbytes) + " on rank " +
                  std::to_string(p));
  }
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, NaN to 0x7fc0: what torch's float -> bfloat16 conversion does.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)0x7fc0 : (uint16_t)r;
}

inline float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

inline uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

// IEEE half <-> float, branch-free (the FP16 library's code that torch's c10::Half also uses).
inline float f16_to_f32(uint16_t h) {
  const uint32_t w = (uint32_t)h << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = bits_f32((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = bits_f32((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t r = sign | (two_w < (1u << 27) ? f32_bits(denormalized) : f32_bits(normalized));
  return bits_f32(r);
}

inline uint16_t f32_to_f16(float f) {
  float base = (__builtin_fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = f32_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = bits_f32((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = f32_bits(base);
  const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
  return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

// dst[i] = srcs[0][i] + srcs[1][i] + ... in rank order, in fp32, rounded once: every rank gets
// the same bits, equal to the fp32 sum in rank order. dst may be one of the srcs (blocks are read
// whole before written). dst2, when not null, gets a copy of each block while it is in L1 (the
// two-shot all-reduce's result goes to the tensor and to the slot the peers copy it from).
template <typename T, typename Load, typename Store>
inline __attribute__((always_inline)) void sum_impl(T* dst, T* dst2, const T* const* srcs, int nsrc, int64_t n,
                                                    Load load, Store store) {
  constexpr int64_t B = 512;
  float acc[B];
  for (int64_t i0 = 0; i0 < n; i0 += B) {
    const int64_t m = std::min(B, n - i0);
    const T* s0 = srcs[0] + i0;
    for (int64_t j = 0; j < m; ++j) acc[j] = load(s0[j]);
    for (int r = 1; r < nsrc; ++r) {
      const T* s = srcs[r] + i0;
      for (int64_t j = 0; j < m; ++j) acc[j] += load(s[j]);
    }
    T* d = dst + i0;
    for (int64_t j = 0; j < m; ++j) d[j] = store(acc[j]);
    if (dst2) memcpy(dst2 + i0, d, m * sizeof(T));
  }
}

TACIT_CLONES void sum_f32(float* dst, float* dst2, const float* const* srcs, int nsrc, int64_t n) {
  sum_impl(dst, dst2, srcs, nsrc, n, [](float x) { return x; }, [](float x) { return x; });
}

TACIT_CLONES void sum_bf16(uint16_t* dst, uint16_t* dst2, const uint16_t* const* srcs, int nsrc, int64_t n) {
  sum_impl(dst, dst2, srcs, nsrc, n, bf16_to_f32, f32_to_bf16);
}

TACIT_CLONES void sum_f16(uint16_t* dst, uint16_t* dst2, const uint16_t* const* srcs, int nsrc, int64_t n) {
  sum_impl(dst, dst2, srcs, nsrc, n, f16_to_f32, f32_to_f16);
}

int64_t dtype_size(Ctx* c, int dtype) {
  switch (dtype) {
    case kFloat32: return 4;
    case kBFloat16:
    case kFloat16: return 2;
  }
  fail(c, "shm communicator: dtype code " + std::to_string(dtype) + " is not float32 (0), bfloat16 (1), float16 (2)");
}

void sum(int dtype, void* dst, const char* const* srcs, int nsrc, int64_t n, void* dst2 = nullptr) {
  if (dtype == kFloat32)
    sum_f32((float*)dst, (float*)dst2, (const float* const*)srcs, nsrc, n);
  else if (dtype == kBFloat16)
    sum_bf16((uint16_t*)dst, (uint16_t*)dst2, (const uint16_t* const*)srcs, nsrc, n);
  else
    sum_f16((uint16_t*)dst, (uint16_t*)dst2, (const uint16_t* const*)srcs, nsrc, n);
}

void check_peer_rank(Ctx* c, int peer, const char* what) {
  if (peer < 0 || peer >= c->world || peer == c->rank)
    fail(c, std::string("shm communicator: ") + what + " rank " + std::to_string(peer) + " is not another rank of " +
                std::to_string(c->world));
}

}  // namespace

Ctx* create(const std::string& name, int rank, int world, int64_t slot_bytes, bool owner) {
  if (world < 1 || world > kMaxRanks || rank < 0 || rank >= world)
    throw std::invalid_argument("shm communicator: rank " + std::to_string(rank) + " of world " +
                                std::to_string(world) + " (at most " + std::to_string(kMaxRanks) + " ranks)");
  slot_bytes = (int64_t)round_up((size_t)std::max<int64_t>(slot_bytes, 64 * world), 4096);
  const int64_t p2p_bytes = std::min<int64_t>(slot_bytes, 1 << 20);
  const size_t hdr_sz = round_up(sizeof(Header), 4096);
  const size_t ctl_sz = round_up(sizeof(RankCtl) * world, 4096);
  const size_t p2pctl_sz = round_up(sizeof(P2PCtl) * world * world, 4096);
  const size_t slots_sz = (size_t)world * 2 * (size_t)slot_bytes;
  const size_t total = hdr_sz + ctl_sz + p2pctl_sz + slots_sz + (size_t)world * world * (size_t)p2p_bytes;

  int fd = shm_open(name.c_str(), owner ? (O_CREAT | O_EXCL | O_RDWR) : O_RDWR, 0600);
  if (fd < 0) throw std::runtime_error("shm communicator: shm_open(" + name + "): " + strerror(errno));
  if (owner) {
    // fallocate reserves the pages now: on a full /dev/shm (64 MB in a default container) a
    // sparse segment would raise SIGBUS at first touch instead of this error.
    int err = ftruncate(fd, (off_t)total) != 0 ? errno : posix_fallocate(fd, 0, (off_t)total);
    if (err) {
      close(fd);
      shm_unlink(name.c_str());
      throw std::runtime_error("shm communicator: cannot reserve " + std::to_string(total >> 20) +
                               " MiB in /dev/shm (" + strerror(err) + "): a smaller buffer, or a larger /dev/shm");
    }
  } else {
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != total) {
      close(fd);
      throw std::runtime_error("shm communicator: segment " + name + " has another size than rank 0 made");
    }
  }
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int merr = errno;
  close(fd);
  if (base == MAP_FAILED) throw std::runtime_error("shm communicator: mmap: " + std::string(strerror(merr)));

  Ctx* c = new Ctx();
  c->name = name;
  c->base = (char*)base;
  c->total = total;
  c->rank = rank;
  c->world = world;
  c->slot_bytes = slot_bytes;
  c->p2p_bytes = p2p_bytes;
  c->hdr = (Header*)base;
  c->ctl = (RankCtl*)(c->base + hdr_sz);
  c->p2p = (P2PCtl*)(c->base + hdr_sz + ctl_sz);
  c->slots = c->base + hdr_sz + ctl_sz + p2pctl_sz;
  c->p2p_buf = c->slots + slots_sz;
  c->sent.assign(world, 0);
  c->taken.assign(world, 0);
  c->chunk_bytes = slot_bytes;
  if (owner) {
    c->hdr->magic = kMagic;
    c->hdr->world = world;
    c->hdr->slot_bytes = slot_bytes;
    c->hdr->p2p_bytes = p2p_bytes;
    c->hdr->abort_rank.store(-1);
  } else if (c->hdr->magic != kMagic || c->hdr->world != world || c->hdr->slot_bytes != slot_bytes) {
    destroy(c);
    throw std::runtime_error("shm communicator: segment " + name + " was made for another group or buffer size");
  }
  c->ctl[rank].pid = getpid();
  return c;
}

void destroy(Ctx* c) {
  if (c->base) munmap(c->base, c->total);
  delete c;
}

void unlink_name(Ctx* c) {
  if (shm_unlink(c->name.c_str()) != 0 && errno != ENOENT)
    throw std::runtime_error("shm communicator: shm_unlink(" + c->name + "): " + strerror(errno));
}

void all_reduce(Ctx* c, void* data, int64_t numel, int dtype) {
  enter(c, "all_reduce");
  const int64_t esize = dtype_size(c, dtype);
  const int64_t total = numel * esize;
  char* d = (char*)data;
  const char* srcs[kMaxRanks];
  for (int64_t off = 0; off < total;) {
    const int64_t n = std::min(c->chunk_bytes, total - off);
    const uint64_t s = c->seq + 1;
    char* chunk = d + off;
    char* mine = c->slot(c->rank, s);
    if (n < c->two_shot_min_bytes || c->world == 1) {
      // One shot: every rank sums every slot (its own input from its tensor) into its tensor.
      memcpy(mine, chunk, n);
      publish(c, s, kAllReduce, total, nullptr);
      wait_all(c, s, kAllReduce, total);
      for (int p = 0; p < c->world; ++p) srcs[p] = p == c->rank ? chunk : c->slot(p, s);
      sum(dtype, chunk, srcs, c->world, n / esize);
    } else {
      // Two shots: rank p sums part p of the chunk and posts it; then each copies the others'.
      // Only the parts the peers sum are copied in: this rank's own part it reads in place.
      const int64_t cnt = n / esize;
      const int64_t per = ((cnt + c->world - 1) / c->world + 31) / 32 * 32;  // 64-byte aligned parts
      auto lo = [&](int p) { return std::min(cnt, p * per) * esize; };
      auto len = [&](int p) { return std::min(cnt, (p + 1) * per) * esize - lo(p); };
      for (int p = 0; p < c->world; ++p)
        if (p != c->rank) memcpy(mine + lo(p), chunk + lo(p), len(p));
      publish(c, s, kAllReduce, total, nullptr);
      wait_all(c, s, kAllReduce, total);
      const int64_t my_lo = lo(c->rank), my_len = len(c->rank);
      for (int p = 0; p < c->world; ++p) srcs[p] = (p == c->rank ? chunk : c->slot(p, s)) + my_lo;
      sum(dtype, chunk + my_lo, srcs, c->world, my_len / esize, mine + my_lo);
      c->ctl[c->rank].reduced.store(s, std::memory_order_release);
      for (int p = 0; p < c->world; ++p) {
        if (p == c->rank) continue;
        wait_for(c, c->ctl[p].reduced, s, p);
        memcpy(chunk + lo(p), c->slot(p, s) + lo(p), len(p));
      }
    }
    off += n;
  }
}

void all_gather(Ctx* c, const void* in, void* out, int64_t nbytes) {
  enter(c, "all_gather");
  const char* src = (const char*)in;
  char* dst = (char*)out;
  for (int64_t off = 0; off < nbytes;) {
    const int64_t n = std::min(c->slot_bytes, nbytes - off);
    const uint64_t s = c->seq + 1;
    memcpy(c->slot(c->rank, s), src + off, n);
    publish(c, s, kAllGather, nbytes, nullptr);
    wait_all(c, s, kAllGather, nbytes);
    for (int p = 0; p < c->world; ++p) memcpy(dst + p * nbytes + off, p == c->rank ? src + off : c->slot(p, s), n);
    off += n;
  }
}

void reduce_scatter(Ctx* c, const void* in, void* out, int64_t part_numel, int dtype) {
  enter(c, "reduce_scatter");
  const int64_t esize = dtype_size(c, dtype);
  const int64_t part = part_numel * esize;
  const int64_t region = (c->slot_bytes / c->world) / 64 * 64;  // rank p's part goes to region p
  const char* src = (const char*)in;
  char* dst = (char*)out;
  const char* srcs[kMaxRanks];
  for (int64_t off = 0; off < part;) {
    const int64_t n = std::min(region, part - off);
    const uint64_t s = c->seq + 1;
    char* mine = c->slot(c->rank, s);
    for (int p = 0; p < c->world; ++p)
      if (p != c->rank) memcpy(mine + p * region, src + p * part + off, n);
    publish(c, s, kReduceScatter, part, nullptr);
    wait_all(c, s, kReduceScatter, part);
    for (int p = 0; p < c->world; ++p)
      srcs[p] = p == c->rank ? src + c->rank * part + off : c->slot(p, s) + c->rank * region;
    sum(dtype, dst + off, srcs, c->world, n / esize);
    off += n;
  }
}

void all_to_all(Ctx* c, const void* in, void* out, const std::vector<int64_t>& send_bytes,
                const std::vector<int64_t>& recv_bytes) {
  enter(c, "all_to_all");
  const int w = c->world, me = c->rank;
  if ((int)send_bytes.size() != w || (int)recv_bytes.size() != w)
    fail(c, "shm communicator: all_to_all needs " + std::to_string(w) + " send and receive sizes");
  if (send_bytes[me] != recv_bytes[me])
    fail(c, "shm communicator: all_to_all sends " + std::to_string(send_bytes[me]) + " bytes to itself but expects " +
                std::to_string(recv_bytes[me]));
  std::vector<int64_t> soff(w + 1, 0), roff(w + 1, 0);
  for (int p = 0; p < w; ++p) {
    soff[p + 1] = soff[p] + send_bytes[p];
    roff[p + 1] = roff[p] + recv_bytes[p];
  }
  const char* src = (const char*)in;
  char* dst = (char*)out;
  memcpy(dst + roff[me], src + soff[me], send_bytes[me]);
  const int64_t region = (c->slot_bytes / w) / 64 * 64;  // data for rank p goes to region p
  int64_t rounds = 1;  // every rank's sizes travel with round 0; then all agree on the count
  for (int64_t k = 0; k < rounds; ++k) {
    const uint64_t s = c->seq + 1;
    char* mine = c->slot(me, s);
    for (int p = 0; p < w; ++p) {
      const int64_t n = std::clamp<int64_t>(send_bytes[p] - k * region, 0, region);
      if (p != me && n) memcpy(mine + p * region, src + soff[p] + k * region, n);
    }
    publish(c, s, kAllToAll, -1, send_bytes.data());
    wait_all(c, s, kAllToAll, -1);
    if (k == 0) {
      for (int p = 0; p < w; ++p) {
        const int64_t* sizes = p == me ? send_bytes.data() : c->ctl[p].meta[s & 1].sizes;
        for (int q = 0; q < w; ++q) rounds = std::max(rounds, (sizes[q] + region - 1) / region);
        if (p != me && sizes[me] != recv_bytes[p])
          fail(c, "shm communicator: all_to_all: rank " + std::to_string(p) + " sends " + std::to_string(sizes[me]) +
                      " bytes to rank " + std::to_string(me) + ", which expects " + std::to_string(recv_bytes[p]));
      }
    }
    for (int p = 0; p < w; ++p) {
      const int64_t n = std::clamp<int64_t>(recv_bytes[p] - k * region, 0, region);
      if (p != me && n) memcpy(dst + roff[p] + k * region, c->slot(p, s) + me * region, n);
    }
  }
}

void send(Ctx* c, const void* data, int64_t nbytes, int dst) {
  enter(c, "send");
  check_peer_rank(c, dst, "send to");
  P2PCtl& ch = c->chan(c->rank, dst);
  char* buf = c->chan_buf(c->rank, dst);
  const char* src = (const char*)data;
  int64_t off = 0;
  do {  // an empty message is still one chunk, as recv expects
    const int64_t n = std::min(c->p2p_bytes, nbytes - off);
    wait_for(c, ch.taken, c->sent[dst], dst);  // the receiver took the previous chunk
    ch.nbytes = nbytes;
    memcpy(buf, src + off, n);
    ch.sent.store(++c->sent[dst], std::memory_order_release);
    off += n;
  } while (off < nbytes);
}

void recv(Ctx* c, void* data, int64_t nbytes, int src) {
  enter(c, "recv");
  check_peer_rank(c, src, "recv from");
  P2PCtl& ch = c->chan(src, c->rank);
  const char* buf = c->chan_buf(src, c->rank);
  char* dst = (char*)data;
  int64_t off = 0;
  do {
    wait_for(c, ch.sent, c->taken[src] + 1, src);
    if (ch.nbytes != nbytes)
      fail(c, "shm communicator: rank " + std::to_string(src) + " sent " + std::to_string(ch.nbytes) +
                  " bytes, rank " + std::to_string(c->rank) + " expects " + std::to_string(nbytes));
    const int64_t n = std::min(c->p2p_bytes, nbytes - off);
    memcpy(dst + off, buf, n);
    ch.taken.store(++c->taken[src], std::memory_order_release);
    off += n;
  } while (off < nbytes);
}

}  // namespace tacit_shm

extern "C" int tacit_shm_all_reduce(void* ctx, void* data, int64_t numel, int dtype_code, char* err,
                                    int64_t err_len) {
  auto* c = (tacit_shm::Ctx*)ctx;
  try {
    tacit_shm::all_reduce(c, data, numel, dtype_code);
    return 0;
  } catch (const std::exception& e) {
    c->error = e.what();
    if (err != nullptr && err_len > 0) snprintf(err, err_len, "%s", e.what());
    return -1;
  }
}
