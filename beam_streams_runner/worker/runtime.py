"""The SDK harness inside a PySpark Python worker, one per pipeline run.

Design section 9: user code runs through Beam's own SDK harness
(`BundleProcessor`, which drives `DoFnRunner`), in process, over an
in-memory data channel; no gRPC, no Docker, no job server. A Python worker
process keeps one `WorkerRuntime` per pipeline run, so bundle processors (and
the user DoFns' `setup`) are reused by every task of that run that lands in the
process. Starting the runtime of a new run tears down the previous one (DoFn
`teardown`).
"""

from __future__ import annotations

import functools
import itertools
import threading

from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.runners import pipeline_context
from apache_beam.runners.portability.fn_api_runner.worker_handlers import (
    FNAPI_RUNNER_CAPABILITIES,
    SingletonStateHandlerFactory,
)
from apache_beam.runners.worker import data_plane, sdk_worker, statesampler
from apache_beam.runners.worker.statecache import StateCache

from beam_streams_runner.state.state_handler import PartitionStateHandler
from beam_streams_runner.worker import beam_speedups

beam_speedups.install()


class RoutingStateHandler(sdk_worker.StateHandler):
    """Forwards state requests to the state of the task now running.

    A PySpark Python worker runs one task at a time, and the harness's bundle
    processors outlive tasks; each task points this router at its partition's
    `PartitionStateHandler`.
    """

    def __init__(self) -> None:
        self.target: PartitionStateHandler = PartitionStateHandler()

    def process_instruction_id(self, bundle_id):
        return self.target.process_instruction_id(bundle_id)

    def get_raw(self, state_key, continuation_token=None):
        return self.target.get_raw(state_key, continuation_token)

    def append_raw(self, state_key, data):
        return self.target.append_raw(state_key, data)

    def clear(self, state_key):
        return self.target.clear(state_key)

    def done(self) -> None:
        pass


def _start_without_thread(sampler) -> None:
    sampler.tracked_thread = threading.current_thread()
    statesampler.set_current_tracker(sampler)
    sampler.started = True


def _stop_without_thread(sampler) -> None:
    statesampler.set_current_tracker(None)
    sampler.finished = True


class _BundleProcessorCache(sdk_worker.BundleProcessorCache):
    """Beam's cache of bundle processors, minus one thread per bundle.

    Each harness bundle starts and joins a state-sampling thread (used for
    progress reports and lull logging, which nothing here asks for); with
    bundles of a thousand elements that costs more than the elements. The
    sampler keeps tracking the current step (user metrics need it), without the
    thread.
    """

    def get(self, instruction_id, bundle_descriptor_id):
        processor = super().get(instruction_id, bundle_descriptor_id)
        sampler = processor.state_sampler
        if not getattr(sampler, 'runs_without_thread', False):
            sampler.start = functools.partial(_start_without_thread, sampler)
            sampler.stop = functools.partial(_stop_without_thread, sampler)
            sampler.runs_without_thread = True
        return processor


class WorkerRuntime:
    """An in-process SDK worker with the descriptors of one pipeline run."""

    _lock = threading.Lock()
    _current: WorkerRuntime | None = None

    def __init__(self, run_id: str, components: bytes, descriptors: dict[str, bytes]) -> None:
        self.run_id = run_id
        self.components = beam_runner_api_pb2.Components.FromString(components)
        self.context = pipeline_context.PipelineContext(self.components)
        self.state_router = RoutingStateHandler()
        self.data_conn = data_plane.InMemoryDataChannel()
        fns = {
            descriptor_id: beam_fn_api_pb2.ProcessBundleDescriptor.FromString(raw)
            for descriptor_id, raw in descriptors.items()
        }
        # No cache tokens are ever sent, so the cache only spans one bundle; state
        # lives in the partition's KeyedStateBackend.
        caching_handler = sdk_worker.GlobalCachingStateHandler(StateCache(0), self.state_router)
        self.processors = _BundleProcessorCache(
            FNAPI_RUNNER_CAPABILITIES,
            SingletonStateHandlerFactory(caching_handler),
            data_plane.InMemoryDataChannelFactory(self.data_conn.inverse()),
            fns)
        self._ids = itertools.count()
        self._coder_impls: dict[str, object] = {}

    @classmethod
    def for_run(
        cls, run_id: str, components: bytes, descriptors: dict[str, bytes]
    ) -> WorkerRuntime:
        with cls._lock:
            current = cls._current
            if current is None or current.run_id != run_id:
                if current is not None:
                    current.shutdown()
                current = cls(run_id, components, descriptors)
                cls._current = current
            return current

    def next_instruction_id(self) -> str:
        return f'{self.run_id}-bundle-{next(self._ids)}'

    def coder_impl(self, coder_id: str):
        impl = self._coder_impls.get(coder_id)
        if impl is None:
            impl = self.context.coders[coder_id].get_impl()
            self._coder_impls[coder_id] = impl
        return impl

    def coder(self, coder_id: str):
        return self.context.coders[coder_id]

    def shutdown(self) -> None:
        self.processors.shutdown()
