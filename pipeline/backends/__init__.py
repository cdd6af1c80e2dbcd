"""How a teacher runs besides eager torch: ONNX / OpenVINO graphs (exported, int8, SmoothQuant), the measured
choice among them, their fidelity kept beside the graph, the sentences they are calibrated on."""
