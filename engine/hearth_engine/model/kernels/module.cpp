// Python bindings of Hearth's native kernels (see hearth_native.h).
#include <torch/extension.h>

#include "hearth_native.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &hearth::decode_attention, "decode attention over own KV and parts");
  m.def("tile_weight", &hearth::tile_weight, "a weight [N, K] as tiled_linear's tiles");
  m.def("tiled_linear", &hearth::tiled_linear, "a linear for a decode step's few rows",
        py::arg("x"), py::arg("tiles"), py::arg("out_features"), py::arg("scales") = py::none(),
        py::arg("bias") = py::none());
  m.def("rms_norm", &hearth::rms_norm, "Llama RMSNorm (float32 normalise, round, scale)");
  m.def("rope", &hearth::rope, "rotary embedding, rotate-half form");
}
