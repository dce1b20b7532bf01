"""ApiVersions (key 18): what every connection asks first.

A broker that does not know the requested version answers UNSUPPORTED_VERSION with a body in the
v0 layout listing what it does support (KIP-511); ``messages.decode_response`` handles that.
"""

from ..schema import BOOL, INT16, INT32, INT64, STRING, Array, Api, Field, Struct

API_VERSIONS = Api(
    18, "ApiVersions", versions=(0, 4), flexible="3+",
    request=Struct(
        Field("client_software_name", STRING, "3+"),
        Field("client_software_version", STRING, "3+"),
    ),
    response=Struct(
        Field("error_code", INT16),
        Field("api_keys", Array(Struct(
            Field("api_key", INT16),
            Field("min_version", INT16),
            Field("max_version", INT16),
        ))),
        Field("throttle_time_ms", INT32, "1+"),
        Field("supported_features", Array(Struct(
            Field("name", STRING),
            Field("min_version", INT16),
            Field("max_version", INT16),
        )), "3+", tag=0),
        Field("finalized_features_epoch", INT64, "3+", tag=1, default=-1),
        Field("finalized_features", Array(Struct(
            Field("name", STRING),
            Field("max_version_level", INT16),
            Field("min_version_level", INT16),
        )), "3+", tag=2),
        Field("zk_migration_ready", BOOL, "3+", tag=3),
    ),
)
