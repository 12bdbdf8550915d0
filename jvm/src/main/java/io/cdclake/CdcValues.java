package io.cdclake;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.HexFormat;

/**
 * Static decoders for Debezium / Kafka Connect value encodings, meant to be called from
 * Spark SQL through {@code reflect(...)} / {@code java_method(...)} so that no Python UDF
 * is needed.
 *
 * <p>Spark's {@code reflect} only passes {@code String}, {@code int}, {@code long},
 * {@code double}, {@code boolean} (and a few other primitive) arguments, so binary columns
 * are passed as the hexadecimal text produced by Spark's {@code hex(binary)}.
 *
 * <p>Caveats verified on Spark 3.5.6:
 * <ul>
 *   <li>{@code reflect} returns {@code String.valueOf(result)}, so a {@code null} result
 *       arrives in SQL as the four-character text {@code "null"}, not SQL NULL. These methods
 *       never return that text otherwise, so wrap calls as
 *       {@code nullif(reflect(...), 'null')} (or {@code CASE WHEN col IS NULL ...}).</li>
 *   <li>A SQL NULL passed for an {@code int} parameter makes the reflective call fail with
 *       {@code IllegalArgumentException}; guard nullable scale/length columns.</li>
 *   <li>The {@code int} parameters need an {@code INT} argument; a {@code BIGINT} does not
 *       resolve (cast it).</li>
 * </ul>
 *
 * <p>The class has no dependencies beyond the JDK.
 */
public final class CdcValues {

    private static final HexFormat HEX = HexFormat.of();

    /** Declared lengths above this are read as "unbounded" by {@link #bitsText}. */
    static final int UNBOUNDED_LENGTH = 1 << 24;

    private CdcValues() {
    }

    private static int significantBits(byte[] littleEndian) {
        for (int b = littleEndian.length - 1; b >= 0; b--) {
            int value = littleEndian[b] & 0xFF;
            if (value != 0) {
                return (b << 3) + (32 - Integer.numberOfLeadingZeros(value));
            }
        }
        return 0;
    }

    /**
     * Decodes a Kafka Connect {@code org.apache.kafka.connect.data.Decimal} or Debezium
     * {@code io.debezium.data.VariableScaleDecimal} unscaled value into plain decimal text.
     *
     * <p>The unscaled value is a big-endian two's-complement integer (the encoding of
     * {@link BigInteger#toByteArray()}); the result is
     * {@code new BigDecimal(new BigInteger(bytes), scale).toPlainString()}, i.e. never in
     * scientific notation.
     *
     * <p>Examples: {@code decimalText("3039", 2)} is {@code "123.45"},
     * {@code decimalText("CFC7", 2)} is {@code "-123.45"}, {@code decimalText("", 2)} is
     * {@code "0.00"}.
     *
     * @param unscaledHex hexadecimal text of the unscaled bytes, as produced by Spark's
     *                    {@code hex(binary)} (upper or lower case). An empty string is read as
     *                    zero (a zero-length array is not a valid {@link BigInteger} encoding,
     *                    but an empty payload can only sensibly mean zero).
     * @param scale       the decimal scale (may be negative, as allowed by {@link BigDecimal})
     * @return the plain decimal text, or {@code null} when {@code unscaledHex} is {@code null}
     * @throws IllegalArgumentException if {@code unscaledHex} is not valid hexadecimal text
     *                                  of whole bytes (odd length or non-hex characters)
     */
    public static String decimalText(String unscaledHex, int scale) {
        if (unscaledHex == null) {
            return null;
        }
        BigInteger unscaled = unscaledHex.isEmpty()
                ? BigInteger.ZERO
                : new BigInteger(HEX.parseHex(unscaledHex));
        return new BigDecimal(unscaled, scale).toPlainString();
    }

    /**
     * Decodes a Debezium {@code io.debezium.data.Bits} value (PostgreSQL {@code BIT(n)} /
     * {@code BIT VARYING(n)}) into PostgreSQL's bit-string text of exactly {@code length}
     * characters.
     *
     * <p>Encoding: the bytes are {@link java.util.BitSet#toByteArray()}, i.e. little-endian
     * (BitSet index {@code i} is bit {@code i % 8} of byte {@code i / 8}), possibly padded with
     * zero bytes at the end or with trailing zero bytes trimmed.
     *
     * <p>Bit order: Debezium builds the BitSet from PostgreSQL's text as
     * <pre>
     * for (int i = len - 1; i &gt;= 0; i--)
     *     if (dataStr.charAt(i) == '1') bitset.set(len - i - 1);
     * </pre>
     * so the <b>rightmost</b> PostgreSQL character is BitSet index 0 (least significant bit of
     * byte 0) and the <b>leftmost</b> character is BitSet index {@code len - 1}. In other words
     * the bytes are the bit string read as an unsigned little-endian binary number: for
     * {@code B'101'} the bytes are {@code 05}; for {@code B'1000000000'} (10 bits) they are
     * {@code 00 02}. Source: debezium/debezium,
     * {@code debezium-connector-postgres/src/main/java/io/debezium/connector/postgresql/PostgresValueConverter.java},
     * method {@code convertBits(Column, Field, Object, int)}, which hands the BitSet to
     * {@code JdbcValueConverters.convertBits}, which emits {@code padLittleEndian(numBytes,
     * bitset.toByteArray())}.
     *
     * <p>Caveat for {@code BIT VARYING(n)}: Debezium's {@code length} schema parameter is the
     * declared maximum {@code n}, not the length of the individual value, and leading
     * (leftmost) zero bits are not recoverable from the bytes. Decoding a varbit value with
     * {@code length = n} therefore left-pads it with zeros to {@code n} characters.
     *
     * @param littleEndianHex hexadecimal text of the Bits bytes, as produced by Spark's
     *                        {@code hex(binary)}; an empty string means all bits are zero
     * @param length          number of bits (PostgreSQL characters) to produce; {@code >= 0}; 0 or more
     *                        than {@link #UNBOUNDED_LENGTH}: unbounded, the value's significant bits
     * @return the bit string of {@code length} characters of {@code '0'}/{@code '1'}, or
     *         {@code null} when {@code littleEndianHex} is {@code null}
     * @throws IllegalArgumentException if {@code length} is negative, the hex text is invalid,
     *                                  or a bit at index {@code >= length} is set (which means
     *                                  the wrong length was supplied)
     */
    public static String bitsText(String littleEndianHex, int length) {
        if (littleEndianHex == null) {
            return null;
        }
        if (length < 0) {
            throw new IllegalArgumentException("length must be >= 0, was " + length);
        }
        byte[] bytes = HEX.parseHex(littleEndianHex);
        if (length == 0 || length > UNBOUNDED_LENGTH) {
            // An unbounded BIT VARYING (no declared length, or the driver's Integer.MAX_VALUE): no width to pad
            // to, so the value's own significant bits, without leading zeros.
            length = significantBits(bytes);
        }
        // reject set bits beyond the requested length
        for (int b = length >>> 3; b < bytes.length; b++) {
            int value = bytes[b] & 0xFF;
            int firstBitIndex = b << 3;
            if (firstBitIndex < length) {
                value &= 0xFF << (length - firstBitIndex); // keep only bits >= length
                value &= 0xFF;
            }
            if (value != 0) {
                throw new IllegalArgumentException(
                        "bit set beyond length " + length + " in Bits value " + littleEndianHex);
            }
        }
        char[] out = new char[length];
        for (int p = 0; p < length; p++) {
            int bit = length - 1 - p; // leftmost character is the highest BitSet index
            int byteIndex = bit >>> 3;
            boolean set = byteIndex < bytes.length && (bytes[byteIndex] & (1 << (bit & 7))) != 0;
            out[p] = set ? '1' : '0';
        }
        return new String(out);
    }
}
