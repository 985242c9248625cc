// The engine's CPU kernels as one extension (kernels.py builds it).
#include <torch/extension.h>

torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& keep, double scale);
bool panels_available();
torch::Tensor pack_panels(torch::Tensor w);
torch::Tensor panel_linear(torch::Tensor x, torch::Tensor panels, int64_t N);
bool panels_bf16_available();
torch::Tensor pack_panels_bf16(torch::Tensor w);
torch::Tensor panel_linear_bf16(torch::Tensor x, torch::Tensor panels, int64_t N);
void bind_decode_layer(pybind11::module& m);
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps);
torch::Tensor silu_mul(torch::Tensor g, torch::Tensor u);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &decode_attention, "attention of a decode step over a KV cache (CPU, fp32)");
  m.def("panels_available", &panels_available, "whether panel_linear was built (AVX2 and FMA)");
  m.def("pack_panels", &pack_panels, "an fp32 weight [N, K] in panels of 16 output columns");
  m.def("panel_linear", &panel_linear, "x [M, K] times pack_panels' weight -> [M, N] (CPU, fp32)");
  m.def("panels_bf16_available", &panels_bf16_available, "whether panel_linear_bf16 was built (AVX512_BF16)");
  m.def("pack_panels_bf16", &pack_panels_bf16, "a weight [N, K] as bf16 pairs in panels of 32 output columns");
  m.def("panel_linear_bf16", &panel_linear_bf16, "x [M, K] (as bf16) times pack_panels_bf16's weight -> [M, N] fp32");
  bind_decode_layer(m);
  m.def("rms_norm", &rms_norm, "x [..., d] / rms(x) * w (CPU, fp32)");
  m.def("silu_mul", &silu_mul, "silu(g) * u (CPU, fp32)");
}
