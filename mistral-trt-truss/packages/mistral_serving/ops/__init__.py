"""Operations: metrics, the request log line and traces, shutdown and drain, the NVIDIA
driver check, the garbage collector, start-up timing."""
