#!/usr/bin/env bash
# Hostile safetensors files (docs/reliability.md, "Bad checkpoints"): truncation, absurd header
# lengths, malformed or non-UTF-8 JSON, bad offsets, dtypes and shapes, duplicate names. Each is
# refused by `catalog` and `merge --full-read` on 2 ranks with exit 3 and one line naming the file
# and the tensor; nothing is left at either output (see bad_family.bash).
source "$(dirname "$0")/bad_family.bash"

fresh && truncate -s -100 "$shard"
reject "truncated shard" \
  "$file: tensor '$last': data_offsets \[[0-9]+, [0-9]+\] reach past the end of the data section \([0-9]+ bytes after the header; truncated\?\)"
fresh && truncate -s -100 f/base/model-00003-of-00004.safetensors
reject "truncated base shard" \
  "f/base/model-00003-of-00004\.safetensors: invalid safetensors file: tensor '[^']+': data_offsets .* reach past the end"
fresh && truncate -s 5 "$shard"
reject "shard shorter than the length field" \
  "$file: file is 5 bytes, shorter than the 8-byte header length field"
fresh && corrupt header-length "$shard" 200000
reject "header length beyond the end of the file" \
  "$file: header length 200000 needs 200008 bytes but the file has only [0-9]+ \(truncated\?\)"
fresh && corrupt header-length "$shard" $((100 * 1024 * 1024))
reject "header length over the 100 MB limit" \
  "$file: header length 104857600 exceeds the limit of 100000000 bytes"
fresh && corrupt raw-header "$shard" "$(printf '{"%s":{"dtype":' "$first" | od -An -tx1 | tr -d ' \n')"
reject "malformed JSON header" "$file: header: not valid JSON: parse error"
fresh && corrupt raw-header "$shard" "$(printf '[1, 2]' | od -An -tx1 | tr -d ' \n')"
reject "header not a JSON object" "$file: header is not a JSON object"
fresh && corrupt raw-header "$shard" "$(printf '{"caf\xe9":{}}' | od -An -tx1 | tr -d ' \n')"
reject "header not UTF-8" "$file: header is not valid UTF-8 \(bad byte at header offset 5\)"
fresh && corrupt shift "$shard" last -2
reject "overlapping offsets" \
  "$file: tensor '$last': data_offsets \[[0-9]+, [0-9]+\] overlap tensor 'model\.layers\.1\.self_attn\.q_proj\.weight'"
fresh && corrupt grow-last "$shard"
reject "out-of-range offsets" "$file: tensor '$last': data_offsets .* reach past the end of the data section"
fresh && corrupt shift "$shard" last 2
reject "gap between tensors" \
  "$file: gap in the data section: bytes \[[0-9]+, [0-9]+\) between tensor '[^']+' and tensor '$last'"
fresh && corrupt shift "$shard" first 2
reject "gap before the first tensor" "$file: tensor '$first' is first in the data section but starts at byte 2"
fresh && corrupt set "$shard" "$first" dtype '"Q4"'
reject "unknown dtype" "$file: tensor '$first': unknown dtype \"Q4\""
fresh && corrupt set "$shard" "$first" shape '[4294967296, 4294967296, 2]'
reject "shape product overflow" \
  "$file: tensor '$first': element count of shape \[4294967296, 4294967296, 2\] overflows 64 bits"
fresh && corrupt set "$shard" "$first" shape '[65]'
reject "shape disagreeing with the offsets" "$file: tensor '$first': data_offsets \[0, 128\] span 128 bytes but BF16 \[65\] needs 130"
fresh && corrupt duplicate "$shard" "$first"
reject "duplicate tensor name in a header" "$file: header: duplicate tensor name '$first'"
fresh && corrupt rename f/expert01 "$first" model.layers.1.mlp.up_proj.weight
reject "one tensor in two shards" \
  "f/expert01: tensor 'model\.layers\.1\.mlp\.up_proj\.weight' appears in both .*/f/expert01/model-00002-of-00004\.safetensors and .*/f/expert01/model-00003-of-00004\.safetensors"

echo "bad safetensors files: ok"
