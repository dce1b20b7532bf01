"""DescribeConfigs (key 32): configuration values of a resource, for the one value ``kdaemon
offsets --reset-offsets`` needs: a consumer-protocol group's session timeout, which says when
the coordinator drops the static members a stopped daemon left behind.

Versions 1-4 as in Kafka 4.4's DescribeConfigsRequest/Response.json (v0 was removed in Kafka 4.0,
KIP-896); flexible from v4.  A GROUP resource (``RESOURCE_GROUP``, KIP-848's group configs)
answers every group config with its value, the broker's ``group.consumer.*`` default where the
group has none of its own (``config_source`` 5, DEFAULT_CONFIG).
"""

from ..schema import BOOL, INT8, INT16, INT32, STRING, Api, Array, Field, Struct

# Kafka's ConfigResource.Type ids.
RESOURCE_BROKER = 4
RESOURCE_GROUP = 32

DESCRIBE_CONFIGS = Api(
    32, "DescribeConfigs", versions=(1, 4), flexible="4+",
    request=Struct(
        Field("resources", Array(Struct(
            Field("resource_type", INT8),
            Field("resource_name", STRING),
            Field("configuration_keys", Array(STRING), nullable="0+", default=None),
            name="DescribeConfigsResource",
        ))),
        Field("include_synonyms", BOOL, "1+", default=False),
        Field("include_documentation", BOOL, "3+", default=False),
        name="DescribeConfigsRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32),
        Field("results", Array(Struct(
            Field("error_code", INT16),
            Field("error_message", STRING, nullable="0+", default=None),
            Field("resource_type", INT8),
            Field("resource_name", STRING),
            Field("configs", Array(Struct(
                Field("name", STRING),
                Field("value", STRING, nullable="0+", default=None),
                Field("read_only", BOOL),
                Field("config_source", INT8, "1+", default=-1),
                Field("is_sensitive", BOOL),
                Field("synonyms", Array(Struct(
                    Field("name", STRING, "1+"),
                    Field("value", STRING, "1+", nullable="0+", default=None),
                    Field("source", INT8, "1+"),
                    name="DescribeConfigsSynonym",
                )), "1+"),
                Field("config_type", INT8, "3+", default=0),
                Field("documentation", STRING, "3+", nullable="0+", default=None),
                name="DescribeConfigsResourceResult",
            ))),
            name="DescribeConfigsResult",
        ))),
        name="DescribeConfigsResponse",
    ),
)
