"""The one root exception and the mapping of every error to a wire code and an HTTP status.

Each error says whose fault it was: ``peer_fault`` is True when the client (or operator) sent
something wrong, False when the broker failed. The broker puts ``server_error`` on the wire in
a Pulsar ``CommandError``/``CommandSendError``; the admin API answers ``http_status`` with
``{"reason": str(err)}``.
"""

from __future__ import annotations

import enum


class ServerError(enum.IntEnum):
    """Pulsar's ``ServerError`` wire codes (PulsarApi.proto facts)."""

    UnknownError = 0
    MetadataError = 1
    PersistenceError = 2
    AuthenticationError = 3
    AuthorizationError = 4
    ConsumerBusy = 5
    ServiceNotReady = 6
    ProducerBlockedQuotaExceededError = 7
    ProducerBlockedQuotaExceededException = 8
    ChecksumError = 9
    UnsupportedVersionError = 10
    TopicNotFound = 11
    SubscriptionNotFound = 12
    ConsumerNotFound = 13
    TooManyRequests = 14
    TopicTerminatedError = 15
    ProducerBusy = 16
    InvalidTopicName = 17
    IncompatibleSchema = 18
    ConsumerAssignError = 19
    TransactionCoordinatorNotFound = 20
    InvalidTxnStatus = 21
    NotAllowedError = 22
    TransactionConflict = 23
    TransactionNotFound = 24
    ProducerFenced = 25


class CompactMQError(Exception):
    """Root of every error compactmq raises on purpose."""

    server_error: ServerError = ServerError.UnknownError
    http_status: int = 500
    peer_fault: bool = False


class InvalidInput(CompactMQError):
    """The peer sent something malformed or out of range."""

    server_error = ServerError.UnknownError
    http_status = 400
    peer_fault = True


class InvalidTopicName(InvalidInput):
    server_error = ServerError.InvalidTopicName
    http_status = 412


class InvalidConfiguration(InvalidInput):
    """A bad config key/value, or a request whose options contradict each other."""

    server_error = ServerError.NotAllowedError
    http_status = 412


class NotFound(CompactMQError):
    http_status = 404
    peer_fault = True


class TopicNotFound(NotFound):
    server_error = ServerError.TopicNotFound


class SubscriptionNotFound(NotFound):
    server_error = ServerError.SubscriptionNotFound


class AlreadyExists(CompactMQError):
    server_error = ServerError.NotAllowedError
    http_status = 409
    peer_fault = True


class Conflict(CompactMQError):
    """The operation cannot run now (e.g. a compaction is already running)."""

    server_error = ServerError.NotAllowedError
    http_status = 409
    peer_fault = True


class NotAllowed(CompactMQError):
    server_error = ServerError.NotAllowedError
    http_status = 405
    peer_fault = True


class ConsumerBusy(CompactMQError):
    server_error = ServerError.ConsumerBusy
    http_status = 409
    peer_fault = True


class ProducerBusy(CompactMQError):
    server_error = ServerError.ProducerBusy
    http_status = 409
    peer_fault = True


class ChecksumError(InvalidInput):
    server_error = ServerError.ChecksumError
    #: the command whose payload failed the check, and its type (set by protocol.frames)
    command: object = None
    command_type: int | None = None


class ProtocolError(InvalidInput):
    """The peer broke the framing or the command grammar; the connection is closed."""

    #: the parsed command when there was one (its request_id helps answer), and its type number
    command: object = None
    command_type: int | None = None


class MalformedEntry(ProtocolError):
    """One entry's bytes cannot be decoded (metadata, batch layout or compressed payload).

    Concerns that entry alone: the broker answers it (SEND_ERROR) and keeps the connection;
    the compactor reports it. Raised by protocol.frames.parse_entry, protocol.batch and
    protocol.compression, never by the frame decoder.
    """


class StorageError(CompactMQError):
    """Storage failed (I/O error, corruption that cannot be repaired)."""

    server_error = ServerError.PersistenceError
    http_status = 500


class MetadataError(CompactMQError):
    server_error = ServerError.MetadataError
    http_status = 500


class PreconditionFailed(InvalidInput):
    """A well-formed request whose value is not acceptable (Pulsar answers 412)."""

    http_status = 412


class CompactionError(CompactMQError):
    """A compaction run failed; the previous compacted view stays in force."""

    http_status = 500


class UnreadableEntry(CompactionError):
    """An entry compaction's scanner cannot read (its protobuf fields run past their bounds)."""


class AdminRequestError(CompactMQError):
    """The admin API refused a request (its reason is the message) or could not be reached."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class ServiceNotReady(CompactMQError):
    server_error = ServerError.ServiceNotReady
    http_status = 503


class ConsumerAssignError(CompactMQError):
    """A Key_Shared consumer declared hash ranges that overlap another consumer's."""

    server_error = ServerError.ConsumerAssignError
    http_status = 409
    peer_fault = True


class IncompatibleSchema(CompactMQError):
    """A producer or consumer schema that the topic's stored schemas do not accept."""

    server_error = ServerError.IncompatibleSchema
    http_status = 409
    peer_fault = True


class AuthenticationFailed(CompactMQError):
    """The peer's credentials are missing, malformed, expired or wrong.

    The message says why in words a client can act on and never contains the credential itself.
    On the wire the connection gets ``AuthenticationError`` and is closed; over HTTP it is a 401.
    """

    server_error = ServerError.AuthenticationError
    http_status = 401
    peer_fault = True


class AuthorizationFailed(CompactMQError):
    """The peer is authenticated, but its role lacks the permission the operation needs."""

    server_error = ServerError.AuthorizationError
    http_status = 403
    peer_fault = True
