package io.cdclake.connect;

import java.nio.ByteBuffer;
import java.util.Base64;
import java.util.Map;

import org.apache.kafka.common.cache.Cache;
import org.apache.kafka.common.cache.LRUCache;
import org.apache.kafka.common.cache.SynchronizedCache;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.ConnectRecord;
import org.apache.kafka.connect.data.Field;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.SchemaBuilder;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.transforms.Transformation;

/**
 * Kafka Connect SMT: a NULL in a nullable column that has a default reaches Kafka as NULL, not as the default.
 *
 * <p>Connect's {@code Struct.get(field)} answers a field's default when its value is null, and the Apicurio 2.6
 * Avro converter (the one Debezium 3.x pins) reads every field that way: a row whose nullable column holds NULL
 * arrives with the column's default, and no consumer can tell the two apart. This transformation rewrites the
 * record's value schema so that the row columns (the fields of {@code before} and {@code after} in a Debezium
 * envelope, or the top-level fields of an event flattened by the unwrap SMT, except its {@code __} fields) carry
 * no Connect default when they are optional; the default moves to the schema parameter {@value #PARAMETER} (its
 * text), which the Avro converter writes as {@code connect.parameters}, so a consumer still sees that the column
 * has one. Values are copied without defaults ({@code Struct.getWithoutDefault}). Required columns, the
 * {@code source} block, keys and tombstones are left alone. Put it last in the connector's {@code transforms}.
 */
public class DefaultsAsParameters<R extends ConnectRecord<R>> implements Transformation<R> {

    /** The schema parameter holding a moved default's text. */
    public static final String PARAMETER = "cdclake.default";

    private final Cache<Schema, Schema> schemas = new SynchronizedCache<>(new LRUCache<>(256));

    @Override
    public void configure(Map<String, ?> configs) {
    }

    @Override
    public ConfigDef config() {
        return new ConfigDef();
    }

    @Override
    public void close() {
    }

    @Override
    public R apply(R record) {
        Schema schema = record.valueSchema();
        if (schema == null || schema.type() != Schema.Type.STRUCT || !(record.value() instanceof Struct)) {
            return record;
        }
        Schema moved = schemas.get(schema);
        if (moved == null) {
            moved = envelope(schema) ? rebuild(schema) : rows(schema, true);
            schemas.put(schema, moved);
        }
        if (moved == schema) {
            return record;
        }
        Struct value = copy((Struct) record.value(), moved);
        return record.newRecord(record.topic(), record.kafkaPartition(), record.keySchema(), record.key(), moved,
                value, record.timestamp(), record.headers());
    }

    private static boolean envelope(Schema schema) {
        return schema.field("op") != null && (schema.field("after") != null || schema.field("before") != null);
    }

    /** An envelope's schema with its {@code before} and {@code after} row schemas rewritten (same object if none
     * changes). */
    private static Schema rebuild(Schema envelope) {
        boolean changed = false;
        SchemaBuilder builder = start(envelope);
        for (Field field : envelope.fields()) {
            Schema fieldSchema = field.schema();
            if ((field.name().equals("before") || field.name().equals("after"))
                    && fieldSchema.type() == Schema.Type.STRUCT) {
                Schema moved = rows(fieldSchema, false);
                changed |= moved != fieldSchema;
                fieldSchema = moved;
            }
            builder.field(field.name(), fieldSchema);
        }
        return changed ? builder.build() : envelope;
    }

    /** A row schema with the defaults of its optional columns moved to {@value #PARAMETER} (same object if it has
     * none). {@code flattened}: skip the unwrap SMT's {@code __} fields. */
    private static Schema rows(Schema row, boolean flattened) {
        boolean changed = false;
        SchemaBuilder builder = start(row);
        for (Field field : row.fields()) {
            Schema column = field.schema();
            boolean ours = !(flattened && field.name().startsWith("__"));
            if (ours && column.isOptional() && column.defaultValue() != null) {
                column = withoutDefault(column);
                changed = true;
            }
            builder.field(field.name(), column);
        }
        return changed ? builder.build() : row;
    }

    /** The same schema (type, name, version, doc, parameters, nested types) without its default, the default's
     * text added as {@value #PARAMETER}. */
    private static Schema withoutDefault(Schema column) {
        SchemaBuilder builder;
        switch (column.type()) {
            case ARRAY:
                builder = SchemaBuilder.array(column.valueSchema());
                break;
            case MAP:
                builder = SchemaBuilder.map(column.keySchema(), column.valueSchema());
                break;
            case STRUCT:
                builder = SchemaBuilder.struct();
                for (Field f : column.fields()) {
                    builder.field(f.name(), f.schema());
                }
                break;
            default:
                builder = SchemaBuilder.type(column.type());
        }
        builder.name(column.name()).version(column.version()).doc(column.doc()).optional();
        if (column.parameters() != null) {
            builder.parameters(column.parameters());
        }
        builder.parameter(PARAMETER, text(column.defaultValue()));
        return builder.build();
    }

    /** A default's text, the same on every worker and run (the schema, so its registry version, must not change
     * from one start to the next). */
    static String text(Object value) {
        if (value instanceof byte[]) {
            return Base64.getEncoder().encodeToString((byte[]) value);
        }
        if (value instanceof ByteBuffer) {
            ByteBuffer copy = ((ByteBuffer) value).duplicate();
            byte[] bytes = new byte[copy.remaining()];
            copy.get(bytes);
            return Base64.getEncoder().encodeToString(bytes);
        }
        if (value instanceof java.util.Date) {
            return Long.toString(((java.util.Date) value).getTime());
        }
        return String.valueOf(value);
    }

    /** A builder of a struct schema with the same name, version, doc, parameters and optionality, no fields (nor a
     * default: Debezium's envelopes and row structs have none). */
    private static SchemaBuilder start(Schema struct) {
        SchemaBuilder builder = SchemaBuilder.struct().name(struct.name()).version(struct.version())
                .doc(struct.doc());
        if (struct.parameters() != null) {
            builder.parameters(struct.parameters());
        }
        if (struct.isOptional()) {
            builder.optional();
        }
        return builder;
    }

    /** The struct's values under `schema` (same field names), nested row structs copied likewise; never the
     * defaults of the old schema. */
    private static Struct copy(Struct value, Schema schema) {
        Struct out = new Struct(schema);
        for (Field field : schema.fields()) {
            Object v = value.getWithoutDefault(field.name());
            if (v instanceof Struct && field.schema().type() == Schema.Type.STRUCT
                    && ((Struct) v).schema() != field.schema()) {
                v = copy((Struct) v, field.schema());
            }
            out.put(field.name(), v);
        }
        return out;
    }
}
