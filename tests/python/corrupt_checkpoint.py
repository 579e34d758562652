#!/usr/bin/python3
"""Crafts broken safetensors files and Hugging Face folders for the hostile-input tests.

Each subcommand damages one file (or folder) in place, in exactly one way, and prints what it did.
Header edits keep the data section and rewrite the 8-byte length, so only the intended fault is
present. Tensor names are looked up in the header; `--tensor last` / `first` pick by offset.

  corrupt_checkpoint.py header-length FILE N          set the 8-byte header length to N
  corrupt_checkpoint.py raw-header FILE HEX           replace the header by these bytes (hex)
  corrupt_checkpoint.py set FILE TENSOR KEY JSON      set a key (dtype, shape, data_offsets)
  corrupt_checkpoint.py shift FILE TENSOR DELTA       move a tensor's data_offsets by DELTA
  corrupt_checkpoint.py grow-last FILE                the last tensor claims one more row
  corrupt_checkpoint.py duplicate FILE TENSOR         the header lists TENSOR twice
  corrupt_checkpoint.py rename DIR TENSOR NEW         rename a tensor in its shard and the index
  corrupt_checkpoint.py add DIR NAME                  append a 1-D BF16 tensor to the last shard
  corrupt_checkpoint.py nonfinite DIR TENSOR nan|inf  store NaN or +Inf in the tensor's 1st entry
  corrupt_checkpoint.py index-entry DIR TENSOR FILE   point TENSOR's weight_map entry at FILE
  corrupt_checkpoint.py shard-of DIR TENSOR           print the shard file holding TENSOR
"""
import json
import os
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def write_raw(path, header_bytes, data):
    # Keep the writer's convention (N a multiple of 8, space padding) so nothing else is odd.
    header_bytes += b" " * ((8 - len(header_bytes) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)) + header_bytes + data)


def write(path, header, data):
    write_raw(path, json.dumps(header, separators=(",", ":")).encode(), data)


def tensors_by_offset(header):
    return sorted((k for k in header if k != "__metadata__"),
                  key=lambda k: header[k]["data_offsets"])


def pick(header, name):
    order = tensors_by_offset(header)
    if name == "first":
        return order[0]
    if name == "last":
        return order[-1]
    if name not in header:
        sys.exit("corrupt_checkpoint: no tensor %r" % name)
    return name


def index_path(folder):
    return os.path.join(folder, "model.safetensors.index.json")


def shard_of(folder, tensor):
    index = index_path(folder)
    if os.path.exists(index):
        with open(index) as f:
            return os.path.join(folder, json.load(f)["weight_map"][tensor])
    return os.path.join(folder, "model.safetensors")


def update_index(folder, change):
    index = index_path(folder)
    if not os.path.exists(index):
        return
    with open(index) as f:
        doc = json.load(f)
    change(doc["weight_map"])
    with open(index, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)


ELEMENT_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
NONFINITE = {  # little-endian bytes of the first element
    ("BF16", "nan"): b"\xc0\x7f", ("BF16", "inf"): b"\x80\x7f",
    ("F16", "nan"): b"\x00\x7e", ("F16", "inf"): b"\x00\x7c",
    ("F32", "nan"): struct.pack("<f", float("nan")), ("F32", "inf"): struct.pack("<f", float("inf")),
}


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    cmd, target, args = argv[1], argv[2], argv[3:]
    if cmd == "header-length":
        with open(target, "r+b") as f:
            f.write(struct.pack("<Q", int(args[0])))
        print("%s: header length set to %s" % (target, args[0]))
    elif cmd == "raw-header":
        _, data = read(target)
        write_raw(target, bytes.fromhex(args[0]), data)
        print("%s: header replaced" % target)
    elif cmd == "set":
        header, data = read(target)
        name = pick(header, args[0])
        header[name][args[1]] = json.loads(args[2])
        write(target, header, data)
        print("%s: tensor %r %s = %s" % (target, name, args[1], args[2]))
    elif cmd == "shift":
        header, data = read(target)
        name = pick(header, args[0])
        header[name]["data_offsets"] = [o + int(args[1]) for o in header[name]["data_offsets"]]
        write(target, header, data)
        print("%s: tensor %r data_offsets %s" % (target, name, header[name]["data_offsets"]))
    elif cmd == "grow-last":
        header, data = read(target)
        name = pick(header, "last")
        entry = header[name]
        row = (entry["data_offsets"][1] - entry["data_offsets"][0]) // entry["shape"][0]
        entry["shape"][0] += 1
        entry["data_offsets"][1] += row
        write(target, header, data)
        print("%s: tensor %r now claims %d bytes past the end" % (target, name, row))
    elif cmd == "duplicate":
        header, data = read(target)
        name = pick(header, args[0])
        text = json.dumps(header, separators=(",", ":"))
        entry = json.dumps({name: header[name]}, separators=(",", ":"))[1:-1]
        write_raw(target, (text[:-1] + "," + entry + "}").encode(), data)
        print("%s: tensor %r listed twice" % (target, name))
    elif cmd == "rename":
        name, new = args
        shard = shard_of(target, name)
        header, data = read(shard)
        header[new] = header.pop(name)
        write(shard, header, data)
        update_index(target, lambda wm: wm.__setitem__(new, wm.pop(name)))
        print("%s: tensor %r renamed %r" % (shard, name, new))
    elif cmd == "add":
        (name,) = args
        index = index_path(target)
        if os.path.exists(index):
            with open(index) as f:
                shard = os.path.join(target, sorted(set(json.load(f)["weight_map"].values()))[-1])
        else:
            shard = os.path.join(target, "model.safetensors")
        header, data = read(shard)
        header[name] = {"dtype": "BF16", "shape": [4], "data_offsets": [len(data), len(data) + 8]}
        write(shard, header, data + bytes(8))
        update_index(target, lambda wm: wm.__setitem__(name, os.path.basename(shard)))
        print("%s: tensor %r added" % (shard, name))
    elif cmd == "nonfinite":
        name, kind = args
        shard = shard_of(target, name)
        header, data = read(shard)
        entry = header[name]
        begin = entry["data_offsets"][0]
        value = NONFINITE[(entry["dtype"], kind)]
        data = data[:begin] + value + data[begin + len(value):]
        write(shard, header, data)
        print("%s: tensor %r element 0 = %s" % (shard, name, kind))
    elif cmd == "index-entry":
        name, file = args
        update_index(target, lambda wm: wm.__setitem__(name, file))
        print("%s: weight_map[%r] = %r" % (index_path(target), name, file))
    elif cmd == "shard-of":
        print(shard_of(target, args[0]))
    else:
        sys.exit("corrupt_checkpoint: unknown command %r\n%s" % (cmd, __doc__))


if __name__ == "__main__":
    main(sys.argv)
