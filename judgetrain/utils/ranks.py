"""Decisions every process of a launch must share: taken once on the main process and broadcast, or OR-ed over
all ranks."""

# Late imports: accelerate, torch (inside the functions that use them): the shared leaves are imported by every
# command, the light ones included: a library comes in with the function that needs it.

from __future__ import annotations

from judgetrain.utils.errors import RecipeError


def decided_on_main(decide):
    """Run ``decide()`` on the main process only (it reads, hashes or changes output_dir) and give every process its
    result, or the same `RecipeError`, so that all ranks go on or stop together."""
    from accelerate import PartialState

    state = PartialState()
    result, failure = None, None
    if state.is_main_process:
        try:
            result = ("ok", decide())
        except RecipeError as e:
            result = ("error", str(e))
        except Exception as e:  # any other failure still reaches the other ranks, which would wait forever
            result, failure = ("crash", f"{type(e).__name__}: {e}"), e
    if state.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        box = [result]
        broadcast_object_list(box, from_process=0)
        result = box[0]
    if failure is not None:
        raise failure
    if result[0] == "error":
        raise RecipeError(result[1])
    if result[0] == "crash":
        raise RuntimeError(f"the main process failed: {result[1]}")
    return result[1]



def any_rank(flags: list[bool]) -> list[bool]:
    """Each flag OR-ed over every process (one small all-reduce), so that all ranks take the same decision; the
    flags themselves when torch.distributed is not up."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return list(flags)
    import torch

    # not accelerate.utils.reduce(..., "max"): it asks PartialState, which sees no distributed run (DistributedType.NO,
    # the flags back unchanged) in a process group that accelerate did not set up itself
    tensor = torch.tensor([1.0 if f else 0.0 for f in flags])
    if dist.get_backend() == "nccl":
        tensor = tensor.cuda()
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [bool(v > 0) for v in tensor.tolist()]

