"""Request and response codes of RocketMQ's remoting protocol (``RequestCode``, ``ResponseCode``,
``RemotingSysResponseCode``) that the adapter uses, and the flags it sends."""

from __future__ import annotations

from enum import IntEnum


class Req(IntEnum):
    PULL_MESSAGE = 11
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_BROKER_CONFIG = 26
    GET_TOPIC_CONFIG = 351
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_SUBSCRIPTIONGROUP = 207
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320
    RECALL_MESSAGE = 370


class Resp(IntEnum):
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    INVALID_PARAMETER = 29
    FLOW_CONTROL = 215
    ILLEGAL_OPERATION = 604


# PullSysFlag: the subscription travels with each pull, so no heartbeat-registered consumer is
# needed (without it the broker answers SUBSCRIPTION_NOT_EXIST); SUSPEND holds an empty pull.
PULL_SUSPEND = 2
PULL_SUBSCRIPTION = 4
# PermName
PERM_WRITE = 2
PERM_READ = 4
#: The broker's template topic for auto-created topics (``TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC``).
DEFAULT_TOPIC = "TBW102"
