"""From Kafka to decoded records: the Kafka source (source.py), the wire framing of schema ids (framing.py), the
Apicurio registry client on requests and its auth (registry.py, auth.py), Avro decoding in the JVM (decode.py).
May import app/config and app/errors.
"""
