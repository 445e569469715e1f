// Vendored verbatim (but for these lines) from github.com/llm-d/llm-d-router
// pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go at tag v0.10.0 (commit 71f4f0999f95b96c49a9d0c4afbd18dfdb943c26), Apache-2.0.
/*
Copyright 2026 The Kubernetes Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/log"

	fwkplugin "github.com/llm-d/llm-d-router/pkg/epp/framework/interface/plugin"
)

const (
	MetricsExtractorType = "core-metrics-extractor"
)

// Configuration parameters for metrics data source and extractor.
type (
	// engineConfigParams holds metric specifications for a specific engine type.
	engineConfigParams struct {
		// Name is the engine type identifier.
		Name string `json:"name"`
		// QueuedRequestsSpec defines the metric specification string for retrieving queued request count.
		QueuedRequestsSpec string `json:"queuedRequestsSpec"`
		// RunningRequestsSpec defines the metric specification string for retrieving running requests count.
		RunningRequestsSpec string `json:"runningRequestsSpec"`
		// KVUsageSpec defines the metric specification string for retrieving KV cache usage.
		KVUsageSpec string `json:"kvUsageSpec"`
		// LoRASpec defines the metric specification string for retrieving LoRA availability.
		LoRASpec string `json:"loraSpec"`
		// CacheInfoSpec defines the metric specification string for retrieving KV cache configuration
		// from an info-style gauge where block_size and num_gpu_blocks are label values.
		CacheInfoSpec string `json:"cacheInfoSpec"`
		// CacheBlockSizeLabelName overrides the label name used to extract block size from CacheInfoSpec.
		// Defaults to "block_size" if empty.
		CacheBlockSizeLabelName string `json:"cacheBlockSizeLabelName,omitempty"`
		// CacheNumBlocksLabelName overrides the label name used to extract num GPU blocks from CacheInfoSpec.
		// Defaults to "num_gpu_blocks" if empty.
		CacheNumBlocksLabelName string `json:"cacheNumBlocksLabelName,omitempty"`
		// CacheBlockSizeSpec defines the metric specification string for retrieving block size directly
		// as a gauge value (alternative to CacheInfoSpec labels). Used by engines like Triton TRT-LLM.
		CacheBlockSizeSpec string `json:"cacheBlockSizeSpec,omitempty"`
		// CacheNumBlocksSpec defines the metric specification string for retrieving num GPU blocks directly
		// as a gauge value (alternative to CacheInfoSpec labels). Used by engines like Triton TRT-LLM.
		CacheNumBlocksSpec string `json:"cacheNumBlocksSpec,omitempty"`
		// CustomMetrics defines engine-specific scalar metrics to extract as endpoint attributes.
		CustomMetrics []customMetricConfigParams `json:"customMetrics,omitempty"`
	}

	customMetricConfigParams struct {
		// AttributeKey is the endpoint attribute key where the scalar value is stored.
		AttributeKey string `json:"attributeKey"`
		// MetricSpec defines the source metric specification string.
		MetricSpec string `json:"metricSpec"`
	}

	// modelServerExtractorParams holds the configuration parameters for the core metrics extractor plugin.
	modelServerExtractorParams struct {
		// EngineLabelKey is the Pod label key used to identify the engine type.
		// Defaults to "llm-d.ai/engine-type".
		EngineLabelKey string `json:"engineLabelKey"`
		// DefaultEngine specifies which engine to use as the default for unlabeled Pods.
		// Can be any engine name from EngineConfigs. Defaults to "vllm".
		DefaultEngine string `json:"defaultEngine"`
		// EngineConfigs defines metric specifications for specific engine types.
		// Built-in configs (vLLM, SGLang, trtllm-serve, triton-tensorrt-llm, triton) are automatically appended if not explicitly defined.
		EngineConfigs []engineConfigParams `json:"engineConfigs"`
	}
)

// Default engine configurations for vLLM, SGLang, trtllm-serve, triton-tensorrt-llm, and triton.
var defaultEngineConfigs = []engineConfigParams{
	{
		Name:                "vllm",
		QueuedRequestsSpec:  "vllm:num_requests_waiting",
		RunningRequestsSpec: "vllm:num_requests_running",
		KVUsageSpec:         "vllm:kv_cache_usage_perc",
		LoRASpec:            "vllm:lora_requests_info",
		CacheInfoSpec:       "vllm:cache_config_info",
	},
	{
		Name:                    "sglang",
		QueuedRequestsSpec:      "sglang:num_queue_reqs",
		RunningRequestsSpec:     "sglang:num_running_reqs",
		KVUsageSpec:             "sglang:token_usage",
		LoRASpec:                "",
		CacheInfoSpec:           "sglang:cache_config_info",
		CacheBlockSizeLabelName: "page_size",
		CacheNumBlocksLabelName: "num_pages",
	},
	{
		Name:                "trtllm-serve",
		QueuedRequestsSpec:  "trtllm_num_requests_waiting",
		RunningRequestsSpec: "trtllm_num_requests_running",
		KVUsageSpec:         "trtllm_kv_cache_utilization",
		LoRASpec:            "",
		CacheInfoSpec:       "",
		CacheBlockSizeSpec:  "trtllm_kv_cache_tokens_per_block",
		CacheNumBlocksSpec:  "trtllm_kv_cache_max_blocks",
	},
	{
		Name:                "triton-tensorrt-llm",
		QueuedRequestsSpec:  "nv_trt_llm_request_metrics{request_type=waiting}",
		RunningRequestsSpec: "nv_trt_llm_request_metrics{request_type=scheduled}",
		KVUsageSpec:         "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}",
		LoRASpec:            "",
		CacheInfoSpec:       "",
		CacheBlockSizeSpec:  "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}",
		CacheNumBlocksSpec:  "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}",
	},
	// "triton" defines standard Triton Inference Server metrics configuration for non-LLM workloads
	// (e.g. classic ML/DL models serving KServe v2 protocols).
	//
	// In contrast:
	// - "triton-tensorrt-llm" is for Triton deployments specifically using the TensorRT-LLM backend for LLMs,
	//   which exposes LLM-specific metrics like KV Cache and token metrics.
	// - "trtllm-serve" is for TensorRT-LLM's standalone C++ server orchestrator, which exposes similar
	//   LLM-specific metrics under different names.
	{
		Name:                "triton",
		QueuedRequestsSpec:  "nv_inference_pending_request_count",
		RunningRequestsSpec: "nv_inference_exec_count",
		KVUsageSpec:         "",
		LoRASpec:            "",
		CacheInfoSpec:       "",
		CacheBlockSizeSpec:  "",
		CacheNumBlocksSpec:  "",
	},
}

// defaultEngineName is the default engine used when defaultEngine is not specified.
const defaultEngineName = "vllm"

// CoreMetricsExtractorFactory is a factory function used to instantiate data layer's metrics
// Extractor plugins specified in a configuration.
func CoreMetricsExtractorFactory(name string, parameters *json.Decoder, handle fwkplugin.Handle) (fwkplugin.Plugin, error) {
	params := defaultExtractorParams()

	if parameters != nil { // overlay the defaults with configured values
		if err := parameters.Decode(params); err != nil {
			return nil, err
		}
	}

	ctx := context.Background()
	if handle != nil {
		ctx = handle.Context()
	}
	return newCoreMetricsExtractorPlugin(ctx, name, params)
}

// newCoreMetricsExtractorPlugin constructs a CoreMetricsExtractor from the given parameters.
// It applies defaults, validates engine configs, builds the mapping registry, and logs any
// disabled metric specs. Use this function directly in tests to bypass JSON marshaling.
func newCoreMetricsExtractorPlugin(ctx context.Context, name string, params *modelServerExtractorParams) (*Extractor, error) {
	if params == nil {
		params = defaultExtractorParams()
	}

	// Apply defaults for unset fields
	if params.DefaultEngine == "" {
		params.DefaultEngine = defaultEngineName
	}
	if params.EngineLabelKey == "" {
		params.EngineLabelKey = DefaultEngineTypeLabelKey
	}

	// Append default engine configs if not explicitly defined by user
	userDefinedEngines := make(map[string]bool)
	for _, ec := range params.EngineConfigs {
		userDefinedEngines[ec.Name] = true
	}
	for _, defaultCfg := range defaultEngineConfigs {
		if !userDefinedEngines[defaultCfg.Name] {
			params.EngineConfigs = append(params.EngineConfigs, defaultCfg)
		}
	}

	logger := log.FromContext(ctx)
	registry := NewMappingRegistry()

	// Validate and register engine configurations
	var defaultMapping *Mapping
	for _, engineConfig := range params.EngineConfigs {
		if engineConfig.Name == "" {
			return nil, errors.New("engine config name cannot be empty")
		}
		if engineConfig.Name == DefaultEngineType {
			return nil, fmt.Errorf("engine config name cannot be %q (reserved)", DefaultEngineType)
		}

		customMetrics, customMetricErrs := customMetricConfigs(engineConfig.CustomMetrics)
		if len(customMetricErrs) != 0 {
			return nil, fmt.Errorf("failed to create mapping for engine %q: %w", engineConfig.Name, errors.Join(customMetricErrs...))
		}

		mapping, err := NewMappingFromConfig(MappingConfig{
			Queue:               engineConfig.QueuedRequestsSpec,
			Running:             engineConfig.RunningRequestsSpec,
			KVUsage:             engineConfig.KVUsageSpec,
			Lora:                engineConfig.LoRASpec,
			CacheInfo:           engineConfig.CacheInfoSpec,
			CacheBlockSizeLabel: engineConfig.CacheBlockSizeLabelName,
			CacheNumBlocksLabel: engineConfig.CacheNumBlocksLabelName,
			CacheBlockSize:      engineConfig.CacheBlockSizeSpec,
			CacheNumBlocks:      engineConfig.CacheNumBlocksSpec,
			CustomMetrics:       customMetrics,
		})
		if err != nil {
			return nil, fmt.Errorf("failed to create mapping for engine %q: %w", engineConfig.Name, err)
		}

		logger.Info("Registered engine mapping", "engine", engineConfig.Name, "mapping", mapping)

		// Register by engine name
		if err := registry.Register(engineConfig.Name, mapping); err != nil {
			return nil, fmt.Errorf("failed to register engine mapping for %q: %w", engineConfig.Name, err)
		}

		// Track the default engine mapping
		if engineConfig.Name == params.DefaultEngine {
			defaultMapping = mapping
		}
	}

	// Validate and register the default engine
	if defaultMapping == nil {
		return nil, fmt.Errorf("defaultEngine %q not found in engineConfigs", params.DefaultEngine)
	}
	if err := registry.Register(DefaultEngineType, defaultMapping); err != nil {
		return nil, fmt.Errorf("failed to register default mapping: %w", err)
	}

	extractor, err := NewCoreMetricsExtractor(registry, params.EngineLabelKey)
	if err != nil {
		return nil, err
	}
	extractor.typedName.Name = name
	return extractor, nil
}

func customMetricConfigs(configs []customMetricConfigParams) ([]CustomMetric, []error) {
	custom := make([]CustomMetric, 0, len(configs))
	var errs []error
	for _, cfg := range configs {
		spec, err := parseStringToSpec(cfg.MetricSpec)
		if err != nil {
			errs = append(errs, fmt.Errorf("custom metric %q: %w", cfg.AttributeKey, err))
			continue
		}
		custom = append(custom, CustomMetric{
			AttributeKey: cfg.AttributeKey,
			Spec:         spec,
		})
	}
	return custom, errs
}

func defaultExtractorParams() *modelServerExtractorParams {
	return &modelServerExtractorParams{
		EngineLabelKey: DefaultEngineTypeLabelKey,
	}
}
