"""DCP dirs read and written by torch's own DCP reader and writer with bytes items kept as they are (used in the
sid chroot by the scripts that rewrite real Megatron torch_dist saves: chroot_chained_optimizer.py,
chroot_nemo2_weights.py). The default planners would unpickle the bytes items (which needs Megatron's classes) and
torch.save BytesIO objects."""
import io

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata


class RawBytes(dcp.DefaultLoadPlanner):
    def load_bytes(self, read_item, value):
        value.seek(0)
        self.original_state_dict[read_item.dest_index.fqn] = io.BytesIO(value.read())


class RawBytesSave(dcp.DefaultSavePlanner):
    def transform_object(self, write_item, object):
        return object if isinstance(object, io.BytesIO) else super().transform_object(write_item, object)


def load_raw(src, keep=lambda key: True):
    """Every item of DCP dir `src` that `keep` accepts: tensors as tensors, bytes items as BytesIO."""
    md = dcp.FileSystemReader(src).read_metadata()
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) if isinstance(m, TensorStorageMetadata) else io.BytesIO()
             for k, m in md.state_dict_metadata.items() if keep(k)}
    dcp.load(state, storage_reader=dcp.FileSystemReader(src), planner=RawBytes(), no_dist=True)
    return state


def save_raw(state, dst):
    dcp.save(state, storage_writer=dcp.FileSystemWriter(dst), planner=RawBytesSave(), no_dist=True)
