// bonsai bench -m PACK [--backend cpu] [-p 512,2048] [-n 128] [-d 0,8192] [-r 5] [--threads N] [--batch 1,8,32]
//              [--act q16] [--json]
// bonsai bench --probe
//
// Like llama-bench: prompt processing (pp: prefill of P tokens) and generation (tg: N decode steps after
// one token, or after -d tokens of context: "tg128@d8192"), each repeated r times, reported as mean +- sd
// tok/s; plus the bytes a decode step moves (weights + the state it reads, the KV cache growing with depth),
// the GB/s that makes, and both as a fraction of this machine's own limits measured in the same run
// (streaming read bandwidth for tg, the int8 dot-product peak for pp: `--probe` prints just those).
// --batch B1,B2,..: tg with B concurrent sequences stepped in one forward per token (BatchGenerator):
// aggregate tok/s (B tokens per step), per-sequence tok/s, bytes per step (the weights once + every
// sequence's state) and the KV + state bytes each sequence holds; it replaces the single-sequence tg.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cmath>
#include <cstdio>
#include <fmt/format.h>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/probe.h"
#include "commands.h"
#include "engine/backends.h"
#include "engine/batch.h"
#include "engine/generate.h"
#include "model/forward.h"
#include "model/pack.h"
#include "pack/rng.h"
#include "util/error.h"
#ifdef BONSAI_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace bonsai::cli {

namespace {

struct BenchArgs {
  std::string model;
  std::string prompts = "512";
  int64_t n = 128;
  int reps = 5;
  int threads = 0;
  std::string act;  // --act: activation precision of the ternary products ("": the backend default)
  std::string backend = "cpu";
  std::string batch;  // --batch: comma-separated batch sizes; empty: the single-sequence tg
  std::string depths = "0";  // -d: context depths (tokens prefilled, untimed) at which the tg runs
  bool json = false;
  bool probe_only = false;
};

struct MeanSd {
  double mean = 0, sd = 0;
};
MeanSd mean_sd(const std::vector<double>& v) {
  MeanSd r;
  if (v.empty()) return r;
  r.mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  double ss = 0;
  for (double x : v) ss += (x - r.mean) * (x - r.mean);
  r.sd = v.size() > 1 ? std::sqrt(ss / double(v.size() - 1)) : 0.0;
  return r;
}

// Comma-separated counts; zeros are dropped (-p 0: no pp) unless keep_zero (-d 0: no context).
std::vector<int64_t> parse_list(const std::string& s, const char* option = "-p", bool keep_zero = false) {
  std::vector<int64_t> v;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string item = s.substr(i, j - i);
    try {
      size_t used = 0;
      const long long x = std::stoll(item, &used);
      if (used != item.size() || x < 0) throw std::invalid_argument(item);
      if (x > 0 || keep_zero) v.push_back(x);
    } catch (const std::exception&) {
      fail("{}: '{}' is not a non-negative count (in '{}')", option, item, s);
    }
    i = j + 1;
  }
  return v;
}

// Multiply-adds one token costs: every ternary weight except the embedding table (one row gathered),
// plus the dense a/b projections.
double macs_per_token(const Model& m) {
  double macs = 0;
  for (const TernaryMatrix* t : m.ternary_matrices())
    if (t != &m.embed) macs += double(t->rows) * double(t->cols);
  for (const LayerWeights& l : m.layers) macs += double(l.gdn.a.size() + l.gdn.b.size());
  return macs;
}

// Bytes of a pack as stored: the GGUF file, or every regular file of an MLX folder.
uint64_t pack_bytes_on_disk(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return fs::file_size(path, ec);
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(path, ec))
    if (e.is_regular_file(ec)) n += e.file_size(ec);
  return n;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void bench(const BenchArgs& a) {
  const int probe_threads = a.threads;
  const bool gpu = a.backend == "cuda";
  nlohmann::ordered_json j;
  double read_gbs = 0, int8_gops = 0;
  std::unique_ptr<Backend> backend;
  if (!a.probe_only) {
    BackendOptions bo;
    bo.threads = a.threads;
    bo.activations = a.act;
    bo.exclusive_model = true;  // this command's model serves this backend only
    backend = make_backend(a.backend, bo);
  }
  std::string act_name;  // the activation precision of the ternary products, as --act spells it
  if (gpu) {
#ifdef BONSAI_HAVE_CUDA
    // The device's own streaming-read bandwidth over a buffer far larger than L2 (no int8 peak probe there:
    // pp is reported as tok/s and Gops/s only).
    if (!backend) backend = make_backend("cuda");
    auto* cuda = dynamic_cast<CudaBackend*>(backend.get());
    std::fprintf(stderr, "probing %s...\n", cuda->device_name().c_str());
    read_gbs = cuda->probe_read_gbs(8ull << 30, 10);
    j["device"] = cuda->device_name();
    const CudaBackend::Options co = cuda->options();
    act_name = co.exact ? "exact" : co.act_levels == 1 ? "q8" : co.gemm_f16 > 0 ? "f16" : "q16";
    j["cuda_activation"] = act_name;  // --act / BONSAI_CUDA_ACT / BONSAI_CUDA_EXACT
#endif
  } else {
    std::fprintf(stderr, "probing this machine (%s kernels)...\n", cpu::kernels_name());
    read_gbs = cpu::probe_read_bandwidth_gbs(probe_threads);
    int8_gops = cpu::probe_int8_dot_peak_gops(probe_threads);
    j["cpu_kernels"] = cpu::kernels_name();
    act_name = cpu::activation_name(cpu::ternary_activation());
    j["cpu_activation"] = act_name;  // --act / BONSAI_CPU_ACT
  }
  // The int8 peak is probed on the CPU only: on a GPU it is null, and pp rows carry no share of it (not a 0 %).
  j["probe"] = {{"read_gb_s", read_gbs}, {"int8_dot_peak_gops", nullptr}};
  if (!gpu) j["probe"]["int8_dot_peak_gops"] = int8_gops;
  if (a.probe_only) {
    if (a.json) std::printf("%s\n", j.dump(2).c_str());
    else if (gpu) std::printf("probe: device streaming read %.0f GB/s\n", read_gbs);
    else
      std::printf("probe: streaming read %.2f GB/s, int8 dot-product peak %.1f Gops/s (%s kernels)\n", read_gbs, int8_gops,
                  cpu::kernels_name());
    return;
  }
  if (a.model.empty()) fail("bench: give a pack with -m (or --probe for the machine limits alone)");
  const std::vector<int64_t> pps = parse_list(a.prompts);
  if (a.n < 0 || a.reps < 1) fail("bench: -n must be >= 0 and -r >= 1");
  const std::vector<int64_t> batches = a.batch.empty() ? std::vector<int64_t>{} : parse_list(a.batch, "--batch");
  if (!a.batch.empty() && batches.empty()) fail("bench: --batch needs at least one batch size >= 1");
  if (!batches.empty() && a.n < 1) fail("bench: --batch measures generation: -n must be >= 1");
  const int64_t max_b = batches.empty() ? 1 : *std::max_element(batches.begin(), batches.end());
  const std::vector<int64_t> depths = parse_list(a.depths, "-d/--depth", /*keep_zero=*/true);
  if (depths.empty()) fail("bench: -d needs at least one depth (0: right after a one-token prompt)");
  if (!batches.empty() && (depths.size() != 1 || depths[0] != 0))
    fail("bench: -d applies to the single-sequence tg, not to --batch");

  auto t0 = std::chrono::steady_clock::now();
  const Pack pack = open_pack(a.model);
  LoadOptions lo;
  lo.threads = a.threads;
  const Model model = load_model(pack, lo);
  const double load_s = seconds_since(t0);
  // The workspace holds max(the backend's prefill chunk, the largest batch) rows (a batched step is one
  // forward of B rows).
  // The Decoder's constructor runs backend.prepare(model): the CPU's weight tiling, the CUDA upload.
  const auto t_prepare = std::chrono::steady_clock::now();
  Decoder decoder(model, *backend, std::max(backend->prefill_chunk(), max_b));
  const double prepare_s = seconds_since(t_prepare);
  int64_t need = a.n + 2;
  for (int64_t p : pps) need = std::max(need, p + 1);
  for (int64_t d : depths) need = std::max(need, d + a.n + 2);
  SessionOptions so;
  so.capacity = need;
  Session session(decoder, so);
  const auto* cpu_be = dynamic_cast<const CpuBackend*>(backend.get());
  const int threads = cpu_be ? cpu_be->threads() : 1;
  const double macs = macs_per_token(model);
  Rng rng(1234);
  auto random_ids = [&](int64_t n) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (auto& id : ids) id = int32_t(rng.next() % uint64_t(model.config.vocab));
    return ids;
  };

  j["model"] = a.model;
  j["format"] = model.source_format;
  j["backend"] = backend->name();
  j["threads"] = threads;
  j["load_seconds"] = load_s;
  j["prepare_seconds"] = prepare_s;
  if (cpu_be) j["cpu_tiled_weight_bytes"] = cpu_be->weight_tiles().bytes();
  std::string device_memory;  // the CUDA line below the header (text mode)
#ifdef BONSAI_HAVE_CUDA
  if (const auto* cuda = dynamic_cast<const CudaBackend*>(backend.get())) {
    // Issue 5's memory bound: the device copy of the weights against the pack's bytes on disk, and what the process holds
    // on the device once the weights and the workspace (max(prefill chunk, largest batch) rows) are there.
    const uint64_t wb = cuda->stats().weight_bytes, pb = pack_bytes_on_disk(a.model);
    const uint64_t used = cuda->device_total_bytes() - cuda->device_free_bytes();
    j["cuda_weight_bytes"] = wb;
    j["pack_bytes"] = pb;
    const double ratio = pb ? double(wb) / double(pb) : 0.0;
    j["cuda_weights_over_pack"] = ratio;
    j["cuda_device_used_bytes"] = used;
    j["cuda_prefill_chunk"] = cuda->prefill_chunk();
    device_memory = fmt::format("device memory: weights {:.3f} GB = {:.4f} x the pack's {:.3f} GB; {:.2f} GB in use with the "
                                "workspace ({}-token prefill chunks)",
                                double(wb) / 1e9, ratio, double(pb) / 1e9, double(used) / 1e9, cuda->prefill_chunk());
  }
#endif
  j["weight_bytes_per_token"] = model.decode_weight_bytes();
  j["macs_per_token"] = macs;
  nlohmann::ordered_json results = nlohmann::ordered_json::array();

  if (!a.json && cpu_be && cpu_be->weight_tiles().bytes() > 0)
    std::printf("load %.2f s; backend prepare %.2f s (%.3f GB of weights tiled for the %s kernels)\n", load_s, prepare_s,
                double(cpu_be->weight_tiles().bytes()) / 1e9, cpu::kernels_name());
  else if (!a.json)
    std::printf("load %.2f s; backend prepare %.2f s\n", load_s, prepare_s);
  if (!a.json) {
    const std::string peak = gpu ? std::string("int8 peak not probed") : fmt::format("int8 peak {:.1f} Gops/s", int8_gops);
    std::printf("%s | %s | %s backend, %d threads, %s kernels, activations %s | read %.2f GB/s, %s (probed)\n",
                a.model.c_str(), model.source_format.c_str(), backend->name(), threads, gpu ? "cuda" : cpu::kernels_name(),
                act_name.c_str(), read_gbs, peak.c_str());
    if (!device_memory.empty()) std::printf("%s\n", device_memory.c_str());
  }
  for (int64_t p : pps) {
    std::vector<double> tps;
    for (int r = 0; r < a.reps + 1; ++r) {  // the first repetition warms up and is not counted
      session.reset();
      const auto ids = random_ids(p);
      auto t = std::chrono::steady_clock::now();
      (void)session.append(ids);
      const double s = seconds_since(t);
      if (r > 0) tps.push_back(double(p) / s);
    }
    const MeanSd ms = mean_sd(tps);
    const double gops = ms.mean * 2.0 * macs / 1e9;
    nlohmann::ordered_json row = {{"test", "pp" + std::to_string(p)}, {"tok_s", ms.mean}, {"tok_s_sd", ms.sd}, {"gops", gops}};
    if (int8_gops > 0) row["pct_int8_peak"] = 100.0 * gops / int8_gops;
    results.push_back(row);
    if (!a.json && int8_gops > 0)
      std::printf("pp%-6lld %10.2f +- %7.2f tok/s | %8.1f Gops/s = %5.1f%% of the int8 dot peak\n", (long long)p, ms.mean,
                  ms.sd, gops, 100.0 * gops / int8_gops);
    else if (!a.json)
      std::printf("pp%-6lld %10.2f +- %7.2f tok/s | %8.1f Gops/s\n", (long long)p, ms.mean, ms.sd, gops);
  }
  for (const int64_t B : batches) {
    // B one-token prompts (random ids), then -n decode steps of all B together.
    std::vector<double> agg, per_seq, gbs;
    double bytes_per_step = 0;
    for (int r = 0; r < a.reps + 1; ++r) {  // the first repetition warms up and is not counted
      BatchOptions bo;
      bo.max_batch = B;
      BatchGenerator gen(decoder, bo);
      GenerateOptions go;
      go.max_new_tokens = a.n + 1;  // the first token comes from each one-token prefill
      for (int64_t b = 0; b < B; ++b) gen.submit(random_ids(1), go);
      gen.run();
      const BatchStats& s = gen.stats();
      bytes_per_step = s.bytes_per_step();
      if (r > 0) {
        agg.push_back(s.aggregate_tok_s());
        per_seq.push_back(s.steps_per_s());
        gbs.push_back(s.decode_gb_s());
      }
    }
    const MeanSd ma = mean_sd(agg), mp = mean_sd(per_seq), mg = mean_sd(gbs);
    const uint64_t seq_state = decoder.state_bytes(need);  // KV (capacity -n + 2) + conv + recurrent
    results.push_back({{"test", "tg" + std::to_string(a.n)}, {"batch", B}, {"tok_s", ma.mean}, {"tok_s_sd", ma.sd},
                       {"per_seq_tok_s", mp.mean}, {"per_seq_tok_s_sd", mp.sd}, {"bytes_per_step", bytes_per_step},
                       {"gb_s", mg.mean}, {"pct_read_bandwidth", 100.0 * mg.mean / read_gbs},
                       {"state_bytes_per_seq", seq_state}, {"kv_capacity", need}});
    if (!a.json)
      std::printf("tg%-6lld B=%-3lld %10.2f +- %7.2f tok/s aggregate | %8.2f tok/s per sequence | %.3f GB per step, "
                  "%6.2f GB/s = %5.1f%% of the read bandwidth | %.2f MB KV+state per sequence (%lld positions)\n",
                  (long long)a.n, (long long)B, ma.mean, ma.sd, mp.mean, bytes_per_step / 1e9, mg.mean,
                  100.0 * mg.mean / read_gbs, double(seq_state) / 1e6, (long long)need);
  }
  for (const int64_t depth : a.n > 0 && batches.empty() ? depths : std::vector<int64_t>{}) {
    std::vector<double> tps, gbs;
    // The CPU read limit drifts on a shared host (34-62 GB/s within minutes on the dev VM), so every timed
    // repetition is bracketed by probes: probes[r] right before repetition r + 1, probes[r + 1] right after
    // it, and the repetition is held against the better of its two (the stricter figure). CUDA: the one probe.
    std::vector<double> probes, pcts;
    uint64_t bytes_per_token = 0;
    for (int r = 0; r < a.reps + 1; ++r) {
      if (r == 1 && !gpu) probes.push_back(cpu::probe_read_bandwidth_gbs(probe_threads));
      session.reset();
      if (depth > 0) (void)session.append(random_ids(depth));  // the context, prefilled and not timed
      GenerateOptions go;
      go.max_new_tokens = a.n + 1;  // the first token comes from the one-token prefill
      const GenerateResult res = generate(session, random_ids(1), go);
      const GenerateStats& s = res.stats;
      bytes_per_token = s.weight_bytes_per_step + (s.decode_steps ? s.state_bytes / uint64_t(s.decode_steps) : 0);
      if (r > 0) {
        tps.push_back(s.decode_tok_s());
        gbs.push_back(s.decode_gb_s());
        if (!gpu) {
          probes.push_back(cpu::probe_read_bandwidth_gbs(probe_threads));
          pcts.push_back(100.0 * gbs.back() / std::max(probes[size_t(r) - 1], probes[size_t(r)]));
        } else {
          pcts.push_back(100.0 * gbs.back() / read_gbs);
        }
      }
    }
    const MeanSd ms = mean_sd(tps), mg = mean_sd(gbs), mp = mean_sd(pcts);
    const double first = probes.empty() ? read_gbs : probes.front(), last = probes.empty() ? read_gbs : probes.back();
    const std::string name = "tg" + std::to_string(a.n) + (depth > 0 ? "@d" + std::to_string(depth) : "");
    nlohmann::ordered_json row = {{"test", name}, {"depth", depth}, {"tok_s", ms.mean}, {"tok_s_sd", ms.sd},
                                  {"bytes_per_token", bytes_per_token}, {"gb_s", mg.mean},
                                  {"read_gb_s_before", first}, {"read_gb_s_after", last},
                                  {"pct_read_bandwidth", mp.mean}, {"pct_read_bandwidth_sd", mp.sd}};
    if (!gpu) {
      row["read_gb_s_probes"] = probes;
      row["pct_read_bandwidth_per_rep"] = pcts;
    }
    results.push_back(row);
    if (!a.json && gpu)
      std::printf("%-8s %10.2f +- %7.2f tok/s | %.3f GB per token, %6.2f GB/s = %5.1f%% of the read bandwidth\n",
                  name.c_str(), ms.mean, ms.sd, double(bytes_per_token) / 1e9, mg.mean, mp.mean);
    else if (!a.json)
      std::printf("%-8s %10.2f +- %7.2f tok/s | %.3f GB per token, %6.2f GB/s = %5.1f +- %4.1f%% of the read bandwidth "
                  "(each repetition against the better of the probes around it: %.2f .. %.2f GB/s)\n",
                  name.c_str(), ms.mean, ms.sd, double(bytes_per_token) / 1e9, mg.mean, mp.mean, mp.sd,
                  *std::min_element(probes.begin(), probes.end()), *std::max_element(probes.begin(), probes.end()));
  }
  j["results"] = results;
  if (a.json) std::printf("%s\n", j.dump(2).c_str());
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Benchmark prompt processing and generation (llama-bench style) against the machine's measured limits");
  auto a = std::make_shared<BenchArgs>();
  cmd->add_option("-m,--model", a->model, "Pack: GGUF file or MLX folder");
  cmd->add_option("-p,--n-prompt", a->prompts, "Prompt lengths to prefill, comma-separated (0: none)")->capture_default_str();
  cmd->add_option("-n,--n-gen", a->n, "Tokens to generate (0: none)")->capture_default_str();
  cmd->add_option("-d,--depth", a->depths,
                  "Context depths for the tg, comma-separated: that many tokens are prefilled (not timed) before "
                  "the generation is timed, e.g. 0,8192")
      ->capture_default_str();
  cmd->add_option("-r,--repetitions", a->reps, "Repetitions of each test (after one warm-up)")->capture_default_str();
  cmd->add_option("--threads", a->threads, "CPU threads (0: all)")->capture_default_str();
  cmd->add_option("--act", a->act, kActHelp);
  cmd->add_option("--backend", a->backend, "ref, cpu or cuda")->capture_default_str();
  cmd->add_option("--batch", a->batch,
                  "Generation with B concurrent sequences in one forward per step, comma-separated sizes (e.g. "
                  "1,8,32): aggregate and per-sequence tok/s; replaces the single-sequence tg");
  cmd->add_flag("--probe", a->probe_only, "Only measure the machine: streaming read bandwidth and int8 dot-product peak");
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a] { bench(*a); });
}

}  // namespace bonsai::cli
