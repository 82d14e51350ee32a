// Python bindings of Hearth's native kernels (see hearth_native.h).
#include <torch/extension.h>

#include "decode_step.h"
#include "hearth_native.h"
#include "quant_linear.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &hearth::decode_attention, "decode attention over own KV and parts");
  m.def("use_attention_amx", &hearth::use_attention_amx,
        "decode attention's bf16 products on AMX tiles (default on where the CPU has them)",
        py::arg("on"));
  m.def("attention_amx", &hearth::attention_amx,
        "whether decode and prefix attention's bf16 products run on AMX tiles now");
  m.def("prefix_attention_ready", &hearth::prefix_attention_ready,
        "whether prefix_attention is built (AVX512-BF16)");
  m.def("prefix_attention_f32_ready", &hearth::prefix_attention_f32_ready,
        "whether prefix_attention takes float32 (AVX2 and FMA)");
  m.def("prefix_attention_f32_first", &hearth::prefix_attention_f32_first,
        "whether float32 prefills go to it before torch's flash kernel (no AVX-512)");
  m.def("prefix_attention", &hearth::prefix_attention,
        "many queries over one prefix part (or a chunk's own keys, causal_tokens > 0), bf16 "
        "dot products; (out, lse) in float32",
        py::arg("query"), py::arg("keys"), py::arg("values"), py::arg("scale"),
        py::arg("causal_tokens") = 0);
  m.def("tile_weight", &hearth::tile_weight, "a weight [N, K] as tiled_linear's tiles");
  m.def("tiled_linear", &hearth::tiled_linear, "a linear for a decode step's few rows",
        py::arg("x"), py::arg("tiles"), py::arg("out_features"), py::arg("scales") = py::none(),
        py::arg("bias") = py::none());
  py::class_<hearth::QuantPlan>(m, "QuantPlan",
                                "a linear of quantized matrices side by side, for decode rows")
      .def(py::init<int64_t, const c10::optional<at::Tensor>&>(), py::arg("in_features"),
           py::arg("bias") = py::none())
      .def("add", &hearth::QuantPlan::add, py::arg("tiles"), py::arg("scales"), py::arg("zeros"),
           py::arg("out_features"), py::arg("group"), py::arg("bits"),
           py::arg("supers") = py::none(), py::arg("per_super") = 0,
           py::return_value_policy::reference)
      .def("__call__", &hearth::QuantPlan::forward, py::arg("x"), py::arg("exact") = false)
      .def_property_readonly("out_features", &hearth::QuantPlan::out_features);
  m.def("quant_dequant_tiles", &hearth::quant_dequant_tiles,
        "4/6/8-bit tiles into the padded [T * 16, K_pad] matrix (prefill)", py::arg("tiles"),
        py::arg("scales"), py::arg("zeros"), py::arg("group"), py::arg("bits"), py::arg("out"),
        py::arg("supers") = py::none(), py::arg("per_super") = 0);
  m.def("quant_dots", &hearth::quant_dots, "the integer dot products of this build");
  m.def("quant_rows", &hearth::quant_rows, "rows of 4/6/8-bit tiles (an embedding lookup)",
        py::arg("tiles"), py::arg("scales"), py::arg("zeros"), py::arg("ids"),
        py::arg("out_features"), py::arg("in_features"), py::arg("group"), py::arg("bits"),
        py::arg("dtype"), py::arg("supers") = py::none(), py::arg("per_super") = 0);
  m.def("rms_norm", &hearth::rms_norm, "Llama RMSNorm (float32 normalise, round, scale)");
  m.def("rope", &hearth::rope, "rotary embedding, rotate-half form");
  py::class_<hearth::StepLinear>(m, "StepLinear", "one linear of a native decode layer")
      .def_static("quant", &hearth::StepLinear::quant, py::arg("plan"))
      .def_static("tiled", &hearth::StepLinear::tiled, py::arg("tiles"), py::arg("out_features"),
                  py::arg("scales") = py::none(), py::arg("bias") = py::none());
  py::class_<hearth::DecodeLayers>(m, "DecodeLayers", "a decode step's layers in one call")
      .def(py::init<int64_t, int64_t, int64_t, double>(), py::arg("heads"), py::arg("kv_heads"),
           py::arg("head_dim"), py::arg("scale"))
      .def("add_layer", &hearth::DecodeLayers::add_layer, py::arg("in_norm"), py::arg("in_eps"),
           py::arg("qkv"), py::arg("o"), py::arg("post_norm"), py::arg("post_eps"),
           py::arg("gate_up"), py::arg("down"), py::arg("q_norm") = py::none(),
           py::arg("q_eps") = 0.0, py::arg("k_norm") = py::none(), py::arg("k_eps") = 0.0)
      .def("__call__", &hearth::DecodeLayers::forward, py::arg("hidden"), py::arg("cos"),
           py::arg("sin"), py::arg("kv"), py::arg("length"), py::arg("keep"),
           py::arg("part_segments"), py::arg("part_rows"),
           // a whole step: the server's event loop runs meanwhile (no Python inside)
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("layers", &hearth::DecodeLayers::layers);
}
