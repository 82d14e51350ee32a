// Python bindings of Hearth's native kernels (see hearth_native.h).
#include <torch/extension.h>

#include "hearth_native.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &hearth::decode_attention, "decode attention over own KV and parts");
  m.def("rms_norm", &hearth::rms_norm, "Llama RMSNorm (float32 normalise, round, scale)");
  m.def("rope", &hearth::rope, "rotary embedding, rotate-half form");
}
