// The module's menu, part 5: Sharding<ReduceScatter> (ZeRO-2), for gflow.torch.ShardedOptimizer (port.hpp).
#include "port.hpp"

GFLOW_PYTHON_COMPOSITION(shard, gflow::Sharding<gflow::ReduceScatter>);
GFLOW_PYTHON_COMPOSITION(fusion_shard, gflow::Fusion<4 << 20>, gflow::Sharding<gflow::ReduceScatter>);
GFLOW_PYTHON_COMPOSITION(fp16_fusion_shard_funneled, gflow::Precision<gflow::half>, gflow::Fusion<4 << 20>, gflow::Overlap<gflow::Funneled>,
                         gflow::Sharding<gflow::ReduceScatter>);
