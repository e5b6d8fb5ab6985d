// tacit's shared-memory communicator: the segment's layout and the per-process context.
//
// One POSIX shared-memory segment per communicator (rank 0 creates it, the others map it, the
// name is unlinked once all have). Layout, every part 4 KiB aligned:
//   Header | RankCtl[world] | P2PCtl[world * world] | slots[world][2][slot_bytes] | p2p[world * world][p2p_bytes]
// A collective is a sequence of numbered exchanges: rank r writes its data into slots[r][seq & 1],
// publishes arrive = seq, waits for every peer's arrive >= seq, then reads the peers' slots.
// Two slots per rank (by parity) are what let consecutive collectives run without a second
// barrier: a rank writes slot parity p for op seq only after every peer published arrive for
// op seq - 1, which they do after they finished reading op seq - 2 (the last user of parity p).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tacit_shm {

constexpr int kMaxRanks = 64;
constexpr uint64_t kMagic = 0x31534d5449434154ULL;  // "TACITSM1"

enum DType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };
enum Op : uint32_t { kAllReduce = 1, kAllGather = 2, kReduceScatter = 3, kAllToAll = 4 };

struct Header {
  uint64_t magic;
  int32_t world;
  int64_t slot_bytes;
  int64_t p2p_bytes;
  // -1, or the rank whose collective failed: the others stop waiting for it and raise too.
  std::atomic<int32_t> abort_rank;
  char abort_msg[256];  // why, written before abort_rank is set
};

// What a rank publishes with each exchange; two copies by parity of seq, for the reason above.
struct Meta {
  uint32_t op;
  int64_t nbytes;
  int64_t sizes[kMaxRanks];  // all_to_all: the bytes this rank sends to each rank
};

struct alignas(64) RankCtl {
  std::atomic<uint64_t> arrive;   // the last exchange whose data this rank posted
  std::atomic<uint64_t> reduced;  // two-shot all_reduce: the last one whose reduced part it posted
  int64_t pid;
  Meta meta[2];
};

struct alignas(64) P2PCtl {
  std::atomic<uint64_t> sent;  // chunks the sender has posted (written by the sender)
  int64_t nbytes;              // the whole message's size, checked by the receiver
  alignas(64) std::atomic<uint64_t> taken;  // chunks the receiver has copied out
};

struct Ctx {
  std::string name;
  char* base = nullptr;
  size_t total = 0;
  int rank = 0, world = 1;
  int64_t slot_bytes = 0, p2p_bytes = 0;
  Header* hdr = nullptr;
  RankCtl* ctl = nullptr;
  P2PCtl* p2p = nullptr;
  char* slots = nullptr;
  char* p2p_buf = nullptr;
  uint64_t seq = 0;                 // exchanges done by this rank (uint64: never wraps in practice)
  std::vector<uint64_t> sent, taken;  // p2p chunks sent to / taken from each peer
  double timeout_s = 600.0;
  int64_t two_shot_min_bytes = 0;  // all_reduce chunks at least this large go reduce-scatter style
  int64_t chunk_bytes = 0;         // all_reduce's chunk (<= slot_bytes)
  std::atomic<bool> broken{false};
  std::string error;               // the last failure, for C callers of tacit_shm_all_reduce

  char* slot(int r, uint64_t s) const { return slots + ((size_t)r * 2 + (s & 1)) * (size_t)slot_bytes; }
  P2PCtl& chan(int src, int dst) const { return p2p[src * world + dst]; }
  char* chan_buf(int src, int dst) const { return p2p_buf + (size_t)(src * world + dst) * (size_t)p2p_bytes; }
};

Ctx* create(const std::string& name, int rank, int world, int64_t slot_bytes, bool owner);
void destroy(Ctx* c);
void unlink_name(Ctx* c);

void all_reduce(Ctx* c, void* data, int64_t numel, int dtype);
void all_gather(Ctx* c, const void* in, void* out, int64_t nbytes);
void reduce_scatter(Ctx* c, const void* in, void* out, int64_t part_numel, int dtype);
void all_to_all(Ctx* c, const void* in, void* out, const std::vector<int64_t>& send_bytes,
                const std::vector<int64_t>& recv_bytes);
void send(Ctx* c, const void* data, int64_t nbytes, int dst);
void recv(Ctx* c, void* data, int64_t nbytes, int src);

}  // namespace tacit_shm

// For C++ callers with no Python in between (a fused decode step): 0 on success, -1 on failure
// with the reason in the context (ShmContext.last_error) and, when err is given, in err
// (err_len bytes). Not to be called while another collective of the same context runs (the
// async thread): they share one sequence.
extern "C" int tacit_shm_all_reduce(void* ctx, void* data, int64_t numel, int dtype_code, char* err,
                                    int64_t err_len);
