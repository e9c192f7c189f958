"""``sgl_kernel.kvcacheio``: the KV-cache transfers ``mem_cache`` imports when the model runner loads."""

from __future__ import annotations

from sgl_kernel._unavailable import unavailable

transfer_kv_all_layer = unavailable(__name__, "transfer_kv_all_layer")
transfer_kv_all_layer_direct_lf_pf = unavailable(__name__, "transfer_kv_all_layer_direct_lf_pf")
transfer_kv_all_layer_lf_pf = unavailable(__name__, "transfer_kv_all_layer_lf_pf")
transfer_kv_all_layer_lf_ph = unavailable(__name__, "transfer_kv_all_layer_lf_ph")
transfer_kv_all_layer_mla = unavailable(__name__, "transfer_kv_all_layer_mla")
transfer_kv_all_layer_mla_lf_pf = unavailable(__name__, "transfer_kv_all_layer_mla_lf_pf")
transfer_kv_direct = unavailable(__name__, "transfer_kv_direct")
transfer_kv_per_layer = unavailable(__name__, "transfer_kv_per_layer")
transfer_kv_per_layer_direct_pf_lf = unavailable(__name__, "transfer_kv_per_layer_direct_pf_lf")
transfer_kv_per_layer_mla = unavailable(__name__, "transfer_kv_per_layer_mla")
transfer_kv_per_layer_mla_pf_lf = unavailable(__name__, "transfer_kv_per_layer_mla_pf_lf")
transfer_kv_per_layer_pf_lf = unavailable(__name__, "transfer_kv_per_layer_pf_lf")
transfer_kv_per_layer_ph_lf = unavailable(__name__, "transfer_kv_per_layer_ph_lf")
